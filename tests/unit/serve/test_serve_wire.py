"""The owner-worker wire's encodings of what crosses it."""

from __future__ import annotations

import orjson

from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.endpoint import EndpointMetrics
from epp.scheduling.request import InferenceRequest
from epp.serve import wire


def test_a_metrics_read_crosses_the_wire_whole():
    read = EndpointMetrics(
        3.0, 5.0, 0.25, frozenset({"a"}), frozenset({"b", "c"}), 4, 16, 1000, 12.5, True,
        1.5, 30.0, (0.01, 0.1), (10.0, 30.0),
    )  # fmt: skip
    sent = orjson.loads(orjson.dumps(wire.metrics_fields(read)))
    assert wire.metrics_from_fields(sent) == read


def test_a_completions_usage_crosses_the_wire_and_none_stays_none():
    for usage in (Usage(7, 3), None):
        sent = orjson.loads(orjson.dumps(wire.usage_fields(usage)))
        assert wire.usage_from(*sent) == usage


def test_a_tokenized_prompts_count_and_block_keys_cross_the_wire():
    # Block keys are unsigned 64-bit (vLLM's), past a signed integer's range.
    keys = (10425716237417591202, 478207472011970175)
    payload = InferenceRequest("m", "m", "p", input_tokens=40, kv_block_keys=keys)
    request = FlowRequest("r1", "f", 0, 1.0, input_tokens=40, payload=payload)
    sent = orjson.loads(orjson.dumps(wire.arrival_fields(request)))
    arrived = wire.request_from_fields(sent, lambda headers: 0)
    assert (arrived.input_tokens, arrived.payload.kv_block_keys) == (40, keys)


def test_an_untokenized_prompt_crosses_without_block_keys():
    request = FlowRequest("r1", "f", 0, 1.0, payload=InferenceRequest("m", "m", "p"))
    sent = orjson.loads(orjson.dumps(wire.arrival_fields(request)))
    assert wire.request_from_fields(sent, lambda headers: 0).payload.kv_block_keys is None
