"""The owner-worker wire's encodings of what crosses it."""

from __future__ import annotations

import orjson

from epp.flowcontrol.request import Usage
from epp.scheduling.endpoint import EndpointMetrics
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
