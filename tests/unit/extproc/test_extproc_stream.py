"""The ext_proc stream state machine, driven without gRPC."""

from __future__ import annotations

import json

import pytest
from extproc_wire import (
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
    response_trailers,
    set_headers,
    streamed,
)

from epp.api.address import format_address
from epp.extproc.events import AdmissionNeeded, FirstToken, Rejected, Release
from epp.extproc.messages import CHUNK_BYTES, ProcessingResponse
from epp.extproc.openai import engine_priority_on
from epp.extproc.stream import ExtProcStream, Phase, StreamSettings
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import Usage

CHAT = {":path": "/v1/chat/completions", ":method": "POST"}
BODY = json.dumps(
    {"model": "llama", "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 7}
).encode()


def machine(priority: int = 0, **settings) -> ExtProcStream:
    return ExtProcStream(lambda headers: priority, StreamSettings(**settings), lambda: "generated")


def admit(stream: ExtProcStream, headers=None, body: bytes = BODY, **kwargs) -> AdmissionNeeded:
    assert stream.receive(request_headers({**CHAT, **(headers or {})}, **kwargs), 0.0) == []
    events = stream.receive(request_body(body), 5.0)
    assert len(events) == 1 and isinstance(events[0], AdmissionNeeded)
    return events[0]


def dispatch(stream: ExtProcStream, endpoint: str = "10.0.0.1:8000", **kwargs):
    needed = admit(stream, **kwargs)
    needed.request.endpoint = endpoint
    return stream.admitted(Outcome.DISPATCHED)


def immediate_status(events) -> int:
    reply = events[0]
    assert isinstance(reply, ProcessingResponse) and reply.HasField("immediate_response")
    return reply.immediate_response.status.code


def test_complete_request_asks_for_admission_with_parsed_fields():
    stream = machine(priority=5)
    needed = admit(stream, headers={"x-request-id": "r-1", "x-llm-d-inference-fairness-id": "t"})
    request = needed.request
    assert (request.request_id, request.fairness_id, request.priority) == ("r-1", "t", 5)
    assert (request.arrival, request.byte_size) == (5.0, len(BODY))
    assert request.input_tokens == len("user: " + "x" * 40 + "\n") // 4 + 1
    assert (request.payload.model, request.payload.target_model) == ("llama", "llama")
    assert request.payload.max_tokens == 7 and request.payload.subset is None
    assert stream.phase is Phase.ADMITTING


def test_request_id_is_generated_and_fairness_defaults_when_headers_absent():
    request = admit(machine()).request
    assert (request.request_id, request.fairness_id) == ("generated", "default-flow")


def test_canonical_fairness_header_wins_over_alias():
    headers = {"x-gateway-inference-fairness-id": "alias", "x-llm-d-inference-fairness-id": "main"}
    assert admit(machine(), headers=headers).request.fairness_id == "main"


def test_fairness_alias_is_read_when_canonical_absent():
    headers = {"x-gateway-inference-fairness-id": "alias"}
    assert admit(machine(), headers=headers).request.fairness_id == "alias"


def test_priority_resolver_sees_request_headers():
    seen = {}
    stream = ExtProcStream(lambda headers: seen.update(headers) or 3)
    assert admit(stream, headers={"x-llm-d-inference-objective": "gold"}).request.priority == 3
    assert seen["x-llm-d-inference-objective"] == "gold"


@pytest.mark.parametrize(("value", "seconds"), [("30s", 30.0), ("1m30s", 90.0), ("2.5s", 2.5)])
def test_ttl_header_is_a_go_duration(value, seconds):
    headers = {"x-llm-d-inference-ttl": value}
    assert admit(machine(), headers=headers).request.ttl == seconds


def test_ttft_slo_header_is_milliseconds():
    assert admit(machine(), headers={"x-llm-d-slo-ttft-ms": "250"}).request.ttft_slo == 0.25


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-llm-d-inference-ttl", "soon"),
        ("x-llm-d-inference-ttl", "2.5"),
        ("x-llm-d-inference-ttl", "-1s"),
        ("x-llm-d-slo-ttft-ms", "soon"),
    ],
)
def test_unusable_ttl_or_ttft_value_is_400(header, value):
    stream = machine()
    events = stream.receive(request_headers({**CHAT, header: value}), 0.0)
    assert immediate_status(events) == 400
    assert isinstance(events[1], Rejected) and events[1].reason == "bad-request"


def test_subset_hint_becomes_ip_set():
    needed = admit(machine(), subset=["10.0.0.1:8000", "[fd00::2]:8000"])
    assert needed.request.payload.subset == frozenset({"10.0.0.1", "fd00::2"})


def test_empty_subset_hint_is_kept_as_empty_set():
    assert admit(machine(), subset=[]).request.payload.subset == frozenset()


def test_body_in_many_chunks_is_joined():
    stream = machine()
    stream.receive(request_headers(CHAT), 0.0)
    assert stream.receive(request_body(BODY[:10], end_of_stream=False), 0.0) == []
    events = stream.receive(request_body(BODY[10:]), 0.0)
    assert events[0].request.byte_size == len(BODY)


def test_dispatch_replies_headers_then_body_with_endpoint_and_metadata():
    headers = {"x-llm-d-inference-objective": "o", "x-gateway-inference-fairness-id": "f"}
    events = dispatch(machine(), headers=headers)
    header_reply = events[0].request_headers.response
    assert header_reply.clear_route_cache
    assert set_headers(events[0]) == {
        "x-gateway-destination-endpoint": "10.0.0.1:8000",
        "content-length": str(len(BODY)),
        "x-request-id": "generated",
    }
    assert list(header_reply.header_mutation.remove_headers) == [
        "x-llm-d-inference-objective",
        "x-gateway-inference-fairness-id",
    ]
    lb = events[0].dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == "10.0.0.1:8000"
    assert [streamed(reply) for reply in events[1:]] == [(BODY, True)]


def test_an_ipv6_endpoint_goes_to_envoy_in_brackets_as_its_address_is_written():
    address = format_address("fd00::1", 8000)
    events = dispatch(machine(), endpoint=address)
    assert set_headers(events[0])["x-gateway-destination-endpoint"] == "[fd00::1]:8000"


def test_large_body_goes_back_in_chunks_of_at_most_62000_bytes():
    body = json.dumps({"model": "m", "prompt": "p" * 150_000}).encode()
    events = dispatch(machine(), headers={":path": "/v1/completions"}, body=body)
    chunks = [streamed(reply) for reply in events[1:]]
    assert [len(chunk) for chunk, _ in chunks] == [CHUNK_BYTES, CHUNK_BYTES, len(body) - 124_000]
    assert [eos for _, eos in chunks] == [False, False, True]
    assert b"".join(chunk for chunk, _ in chunks) == body


def test_model_rewrite_changes_body_model_and_content_length():
    events = dispatch(machine(), headers={"x-llm-d-model-name-rewrite": "llama-lora"})
    body = b"".join(streamed(reply)[0] for reply in events[1:])
    assert json.loads(body)["model"] == "llama-lora"
    assert set_headers(events[0])["content-length"] == str(len(body))


def test_model_rewrite_alias_header_is_honoured():
    needed = admit(machine(), headers={"x-gateway-model-name-rewrite": "other"})
    assert needed.request.payload.target_model == "other"


def forwarded_body(events) -> dict:
    return json.loads(b"".join(streamed(reply)[0] for reply in events[1:]))


VLLM = {"llm-d.ai/engine-type": "vllm"}


def test_priority_goes_into_the_body_negated_for_a_vllm_endpoint():
    labels = {"10.0.0.1:8000": VLLM}
    events = dispatch(machine(priority=7, priority_in_body=engine_priority_on(labels.__getitem__)))
    assert forwarded_body(events)["priority"] == -7


@pytest.mark.parametrize(
    "labels",
    [{"llm-d.ai/engine-type": "sglang"}, {}],
    ids=["sglang", "unlabelled"],
)
def test_priority_goes_into_the_body_as_it_is_for_another_or_no_engine(labels):
    priority_in_body = engine_priority_on(lambda address: labels)
    events = dispatch(machine(priority=7, priority_in_body=priority_in_body))
    assert forwarded_body(events)["priority"] == 7


def test_the_legacy_engine_label_names_vllm_too():
    legacy = {"inference.networking.k8s.io/engine-type": "VLLM"}
    priority_in_body = engine_priority_on(lambda address: legacy)
    events = dispatch(machine(priority=2, priority_in_body=priority_in_body))
    assert forwarded_body(events)["priority"] == -2


def test_a_clients_own_priority_is_replaced_and_content_length_follows():
    body = json.dumps({"model": "m", "prompt": "p", "priority": -100}).encode()
    events = dispatch(
        machine(priority=3, priority_in_body=engine_priority_on(lambda address: VLLM)),
        headers={":path": "/v1/completions"},
        body=body,
    )
    forwarded = b"".join(streamed(reply)[0] for reply in events[1:])
    assert json.loads(forwarded)["priority"] == -3
    assert set_headers(events[0])["content-length"] == str(len(forwarded))


def test_without_propagation_the_body_goes_upstream_unchanged():
    body = json.dumps({"model": "m", "prompt": "p", "priority": -100}).encode()
    events = dispatch(machine(priority=3), headers={":path": "/v1/completions"}, body=body)
    assert b"".join(streamed(reply)[0] for reply in events[1:]) == body


def test_a_request_without_a_body_priority_goes_upstream_as_sent():
    body = json.dumps({"model": "m", "prompt": "p", "priority": -100}).encode()
    events = dispatch(
        machine(priority=3, priority_in_body=lambda request: None),
        headers={":path": "/v1/completions"},
        body=body,
    )
    assert b"".join(streamed(reply)[0] for reply in events[1:]) == body


def test_propagation_keeps_a_rewritten_model():
    events = dispatch(
        machine(priority=1, priority_in_body=engine_priority_on(lambda address: VLLM)),
        headers={"x-llm-d-model-name-rewrite": "llama-lora"},
    )
    assert (forwarded_body(events)["model"], forwarded_body(events)["priority"]) == (
        "llama-lora",
        -1,
    )


def test_an_anthropic_body_gets_no_priority_as_the_reference_has_no_rewriter_for_it():
    body = json.dumps(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    events = dispatch(
        machine(priority=4, priority_in_body=engine_priority_on(lambda address: VLLM)),
        headers={":path": "/v1/messages"},
        body=body,
    )
    assert b"".join(streamed(reply)[0] for reply in events[1:]) == body


OUTCOME_REPLIES = [
    (Outcome.REJECTED_SATURATED, 429, "rejected-saturated"),
    (Outcome.REJECTED_FILTERED, 429, "rejected-saturated"),
    (Outcome.REJECTED_TTL_EXPIRED, 429, "rejected-ttl-expired"),
    (Outcome.REJECTED_NO_ENDPOINTS, 503, "rejected-no-endpoints"),
    (Outcome.CANCELLED, 503, "rejected-context-cancelled"),
    (Outcome.REJECTED_SHUTTING_DOWN, 503, "rejected-shutting-down"),
]


def test_the_outcome_table_covers_every_outcome_but_dispatch():
    assert {row[0] for row in OUTCOME_REPLIES} == set(Outcome) - {Outcome.DISPATCHED}


@pytest.mark.parametrize(("outcome", "status", "reason"), OUTCOME_REPLIES)
def test_an_ended_request_gets_its_status_and_reason_header(outcome, status, reason):
    stream = machine()
    admit(stream)
    events = stream.admitted(outcome)
    immediate = events[0].immediate_response
    assert immediate.status.code == status
    assert [(o.header.key, o.header.raw_value) for o in immediate.headers.set_headers] == [
        ("x-llm-d-request-dropped-reason", reason.encode())
    ]
    assert reason.encode() in immediate.body
    assert events[1] == Rejected(status, reason, stream.request)
    assert stream.close() == []


CONTROL_HEADERS = {
    "x-llm-d-inference-objective": "premium",
    "x-gateway-inference-objective": "premium",
    "x-llm-d-inference-fairness-id": "tenant",
    "x-gateway-inference-fairness-id": "tenant",
    "x-llm-d-inference-ttl": "30s",
    "x-llm-d-slo-ttft-ms": "500",
    "x-slo-ttft-ms": "500",
}


def test_every_control_header_is_stripped_before_the_request_goes_upstream():
    events = dispatch(machine(), headers={**CONTROL_HEADERS, "x-kept": "yes"})
    mutation = events[0].request_headers.response.header_mutation
    assert sorted(mutation.remove_headers) == sorted(CONTROL_HEADERS)
    assert not set(set_headers(events[0])) & set(CONTROL_HEADERS)


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1]", b'{"messages": []}', b'{"model": "m"}', b'{"model": 3, "messages": []}'],
)
def test_unparseable_request_body_is_400(body):
    stream = machine()
    stream.receive(request_headers(CHAT), 0.0)
    events = stream.receive(request_body(body), 0.0)
    assert immediate_status(events) == 400
    assert stream.request is None


def test_headers_without_body_are_400_when_no_endpoint_source_is_given():
    events = machine().receive(request_headers(CHAT, end_of_stream=True), 0.0)
    assert immediate_status(events) == 400


def test_a_request_without_a_body_goes_to_the_endpoint_given_at_once():
    stream = machine(any_endpoint=lambda: "10.0.0.9:8000")
    models = {":path": "/v1/models", ":method": "GET", "x-llm-d-inference-objective": "o"}
    events = stream.receive(request_headers(models, end_of_stream=True), 0.0)
    assert len(events) == 1
    assert set_headers(events[0]) == {
        "x-gateway-destination-endpoint": "10.0.0.9:8000",
        "x-request-id": "generated",
    }
    assert list(events[0].request_headers.response.header_mutation.remove_headers) == [
        "x-llm-d-inference-objective"
    ]
    assert stream.phase is Phase.UPSTREAM
    assert stream.request is None


MODEL_LIST = b'{"object":"list","data":[{"id":"m"}]}'


def immediate_headers(reply) -> dict[str, str]:
    return {
        option.header.key: option.header.raw_value.decode()
        for option in reply.immediate_response.headers.set_headers
    }


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/", "/v1/models?limit=5"])
def test_with_the_models_responder_the_model_list_is_answered_here(path):
    stream = machine(models=lambda: MODEL_LIST, any_endpoint=lambda: "10.0.0.9:8000")
    events = stream.receive(
        request_headers({":path": path, ":method": "GET"}, end_of_stream=True), 0
    )
    assert immediate_status(events) == 200
    assert events[0].immediate_response.body == MODEL_LIST
    assert immediate_headers(events[0])["content-type"] == "application/json"
    assert stream.phase is Phase.DONE and len(events) == 1


def test_the_models_responder_answers_503_while_no_endpoint_reported_its_models():
    stream = machine(models=lambda: None)
    get = {":path": "/v1/models", ":method": "GET"}
    events = stream.receive(request_headers(get, end_of_stream=True), 0)
    assert immediate_status(events) == 503


def test_without_the_models_responder_the_model_list_goes_to_an_endpoint():
    stream = machine(any_endpoint=lambda: "10.0.0.9:8000")
    get = {":path": "/v1/models", ":method": "GET"}
    events = stream.receive(request_headers(get, end_of_stream=True), 0)
    assert set_headers(events[0])["x-gateway-destination-endpoint"] == "10.0.0.9:8000"


def test_the_models_responder_leaves_other_requests_alone():
    stream = machine(models=lambda: MODEL_LIST, any_endpoint=lambda: "10.0.0.9:8000")
    other = {":path": "/v1/models/m", ":method": "GET"}
    events = stream.receive(request_headers(other, end_of_stream=True), 0)
    assert set_headers(events[0])["x-gateway-destination-endpoint"] == "10.0.0.9:8000"
    assert admit(machine(models=lambda: MODEL_LIST)).request is not None


def test_a_request_without_a_body_and_no_endpoint_is_500():
    events = machine(any_endpoint=lambda: None).receive(
        request_headers({":path": "/v1/models"}, end_of_stream=True), 0.0
    )
    assert immediate_status(events) == 500


def test_the_schedulers_routing_headers_go_upstream_and_a_clients_own_are_removed():
    stream = machine()
    needed = admit(stream, headers={"x-prefiller-host-port": "6.6.6.6:1"})
    needed.request.endpoint = "10.0.0.1:8000"
    needed.request.payload.routing = {"x-encoder-hosts-ports": "10.0.0.3:8000"}
    events = stream.admitted(Outcome.DISPATCHED)
    assert set_headers(events[0])["x-encoder-hosts-ports"] == "10.0.0.3:8000"
    assert (
        "x-prefiller-host-port" in events[0].request_headers.response.header_mutation.remove_headers
    )


def test_a_destination_set_by_the_scheduler_replaces_the_endpoint():
    stream = machine()
    needed = admit(stream)
    needed.request.endpoint = "10.0.0.1:8001"
    needed.request.payload.destination = "10.0.0.1:8000"
    events = stream.admitted(Outcome.DISPATCHED)
    assert set_headers(events[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"


def test_fallbacks_follow_the_destination_in_the_header_and_the_metadata():
    stream = machine()
    needed = admit(stream)
    needed.request.endpoint = "10.0.0.1:8000"
    needed.request.payload.fallbacks = ("10.0.0.2:8000", "10.0.0.3:8000")
    events = stream.admitted(Outcome.DISPATCHED)
    listed = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"
    assert set_headers(events[0])["x-gateway-destination-endpoint"] == listed
    lb = events[0].dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == listed


def test_the_scheduler_sees_the_request_headers():
    needed = admit(machine(), headers={"x-session-token": "abc"})
    assert needed.request.payload.headers["x-session-token"] == "abc"


def test_response_headers_the_schedulers_plugins_wrote_go_to_the_client():
    stream = machine()
    needed = admit(stream)
    needed.request.endpoint = "10.0.0.1:8000"
    needed.request.payload.response_headers = {"x-session-token": "ZGVmYXVsdC9wb2Q="}
    stream.admitted(Outcome.DISPATCHED)
    reply = stream.receive(response_headers({"content-type": "application/json"}), 0.0)[0]
    mutation = reply.response_headers.response.header_mutation
    written = {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}
    assert written == {"x-session-token": "ZGVmYXVsdC9wb2Q="}


def test_response_headers_are_left_alone_when_no_plugin_wrote_any():
    stream = machine()
    dispatch(stream)
    reply = stream.receive(response_headers({"content-type": "application/json"}), 0.0)[0]
    assert not reply.response_headers.response.HasField("header_mutation")


def test_declared_content_length_over_limit_is_413_at_headers():
    stream = machine(max_body_bytes=100)
    events = stream.receive(request_headers({**CHAT, "content-length": "101"}), 0.0)
    assert immediate_status(events) == 413


def test_more_headers_than_the_limit_is_431_at_headers():
    stream = machine(max_header_count=10)
    flood = {**CHAT, **{f"x-flood-{i}": "v" for i in range(10)}}
    events = stream.receive(request_headers(flood), 0.0)
    assert immediate_status(events) == 431
    assert stream.request is None


def test_headers_over_the_byte_limit_are_431_at_headers():
    stream = machine(max_header_bytes=1024)
    events = stream.receive(request_headers({**CHAT, "x-big": "v" * 1024}), 0.0)
    assert immediate_status(events) == 431


def test_headers_within_the_limits_pass():
    stream = machine(max_header_count=len(CHAT), max_header_bytes=1024)
    assert stream.receive(request_headers(CHAT), 0.0) == []


def test_body_growing_over_limit_is_413_and_the_rest_is_ignored():
    stream = machine(max_body_bytes=100)
    stream.receive(request_headers(CHAT), 0.0)
    assert stream.receive(request_body(b"x" * 60, end_of_stream=False), 0.0) == []
    assert (
        immediate_status(stream.receive(request_body(b"x" * 60, end_of_stream=False), 0.0)) == 413
    )
    assert stream.receive(request_body(b"x" * 60), 0.0) == []
    assert stream._body == []


def test_request_trailers_end_the_request_and_keep_body_open_for_them():
    stream = machine()
    stream.receive(request_headers(CHAT), 0.0)
    stream.receive(request_body(BODY, end_of_stream=False), 0.0)
    needed = stream.receive(request_trailers(), 0.0)[0]
    needed.request.endpoint = "10.0.0.1:8000"
    events = stream.admitted(Outcome.DISPATCHED)
    assert streamed(events[1]) == (BODY, False)
    assert events[2].HasField("request_trailers")


def test_streamed_response_is_echoed_chunk_by_chunk_and_usage_read_from_sse():
    stream = machine()
    dispatch(stream)
    assert stream.receive(response_headers({"content-type": "text/event-stream"}), 0.0)[0].HasField(
        "response_headers"
    )
    first = b'data: {"choices":[{"text":"a"}],"usage":null}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":3}}\n\n'
    echo, started = stream.receive(response_body(first), 0.0)
    assert (streamed(echo), started) == ((first, False), FirstToken(stream.request))
    assert [streamed(r) for r in stream.receive(response_body(usage[:20]), 0.0)] == [
        (usage[:20], False)
    ]
    assert [streamed(r) for r in stream.receive(response_body(usage[20:]), 0.0)] == [
        (usage[20:], False)
    ]
    events = stream.receive(response_body(b"data: [DONE]\n\n", end_of_stream=True), 0.0)
    assert streamed(events[0]) == (b"data: [DONE]\n\n", True)
    assert events[1] == Release(stream.request, Usage(11, 3))


def test_the_release_tells_the_response_size_and_first_body_time():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "text/event-stream"}), 1.0)
    stream.receive(response_body(b""), 2.0)
    stream.receive(response_body(b"data: {}\n\n"), 3.0)
    (release,) = stream.receive(response_body(b"data: [DONE]\n\n", end_of_stream=True), 4.0)[1:]
    assert (release.response_bytes, release.first_byte_at, release.streaming) == (24, 3.0, True)


def test_json_response_usage_is_reported_at_end():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "application/json"}), 0.0)
    body = b'{"usage": {"prompt_tokens": 9, "completion_tokens": 4}}'
    assert streamed(stream.receive(response_body(body[:10]), 0.0)[0]) == (body[:10], False)
    events = stream.receive(response_body(body[10:], end_of_stream=True), 0.0)
    assert events[1] == Release(stream.request, Usage(9, 4))


def test_responses_api_usage_is_read_from_completed_event():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "text/event-stream"}), 0.0)
    usage = b'{"usage":{"input_tokens":5,"output_tokens":6}}'
    event = b'data: {"type":"response.completed","response":' + usage + b"}\n"
    events = stream.receive(response_body(event, end_of_stream=True), 0.0)
    assert events[1] == Release(stream.request, Usage(5, 6))


def test_response_without_usage_releases_with_unknown_input_tokens():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "application/json"}), 0.0)
    events = stream.receive(response_body(b"{}", end_of_stream=True), 0.0)
    assert events[1] == Release(stream.request, None)


def test_rewritten_model_name_is_restored_in_held_json_response():
    stream = machine()
    dispatch(stream, headers={"x-llm-d-model-name-rewrite": "target"})
    stream.receive(response_headers({"content-type": "application/json"}), 0.0)
    assert stream.receive(response_body(b'{"model": "tar'), 0.0) == []
    events = stream.receive(response_body(b'get", "id": 1}', end_of_stream=True), 0.0)
    assert streamed(events[0]) == (b'{"model": "llama", "id": 1}', True)


def test_rewritten_model_name_is_restored_in_each_sse_chunk():
    stream = machine()
    dispatch(stream, headers={"x-llm-d-model-name-rewrite": "target"})
    stream.receive(response_headers({"content-type": "text/event-stream"}), 0.0)
    events = stream.receive(response_body(b'data: {"model":"target"}\n\n'), 0.0)
    assert streamed(events[0]) == (b'data: {"model":"llama"}\n\n', False)


def test_response_trailers_get_trailers_reply_and_release():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "application/json"}), 0.0)
    stream.receive(response_body(b"{}"), 0.0)
    events = stream.receive(response_trailers(), 0.0)
    assert events[0].HasField("response_trailers")
    assert events[1] == Release(stream.request, None)


def test_response_headers_with_end_of_stream_release_at_once():
    stream = machine()
    dispatch(stream)
    events = stream.receive(response_headers({}, end_of_stream=True), 0.0)
    assert events[1] == Release(stream.request, None)
    assert stream.close() == []


def test_the_release_carries_the_model_servers_status():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({":status": "404", "content-type": "application/json"}), 0.0)
    (release,) = stream.receive(response_body(b"{}", end_of_stream=True), 0.0)[-1:]
    assert isinstance(release, Release) and release.upstream_status == 404


def test_close_after_dispatch_releases_once_with_usage_seen_so_far():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "text/event-stream"}), 0.0)
    stream.receive(
        response_body(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\n'), 0.0
    )
    assert stream.close() == [Release(stream.request, Usage(1, 2))]
    assert stream.close() == []


def test_close_while_admitting_emits_nothing_and_late_dispatch_is_released():
    stream = machine()
    needed = admit(stream)
    assert stream.close() == []
    needed.request.endpoint = "10.0.0.1:8000"
    assert stream.admitted(Outcome.DISPATCHED) == [Release(needed.request, None)]


def test_admission_failure_is_500():
    stream = machine()
    admit(stream)
    assert immediate_status(stream.admission_failed()) == 500


def test_dispatch_without_endpoint_is_500_and_releases():
    stream = machine()
    admit(stream)
    events = stream.admitted(Outcome.DISPATCHED)
    assert immediate_status(events) == 500
    assert events[-1] == Release(stream.request, None)


def test_body_before_headers_is_protocol_error_500():
    events = machine().receive(request_body(BODY), 0.0)
    assert immediate_status(events) == 500
    assert events[1].reason == "protocol-error"


def test_response_before_dispatch_is_protocol_error_500():
    stream = machine()
    stream.receive(request_headers(CHAT), 0.0)
    assert immediate_status(stream.receive(response_headers({}), 0.0)) == 500


def test_messages_after_the_end_are_ignored():
    stream = machine()
    stream.receive(request_headers(CHAT, end_of_stream=True), 0.0)
    assert stream.receive(request_body(BODY), 0.0) == []
    assert stream.receive(response_headers({}), 0.0) == []
    assert stream.close() == []


def test_request_messages_after_dispatch_are_ignored():
    stream = machine()
    dispatch(stream)
    assert stream.receive(request_body(BODY), 0.0) == []
    assert stream.phase is Phase.UPSTREAM


def test_an_admitter_denial_is_500_without_a_dropped_reason():
    stream = machine(priority=-1)
    admit(stream)
    events = stream.denied("probabilistic-admitter: rejected, saturation=1.000 prob=1.00")
    reply = events[0].immediate_response
    assert reply.status.code == 500
    assert b"request cannot be admitted: probabilistic-admitter: rejected" in reply.body
    assert all(o.header.key != "x-llm-d-request-dropped-reason" for o in reply.headers.set_headers)
    assert events[1] == Rejected(500, "admission-denied", stream.request)
    assert stream.phase is Phase.DONE


def test_a_denial_after_the_request_ended_does_nothing():
    stream = machine()
    dispatch(stream)
    assert stream.denied("late") == []


def test_an_evicted_request_gets_429_evicted_and_is_released_once():
    stream = machine(priority=-1)
    dispatch(stream)
    events = stream.evict()
    reply = events[0].immediate_response
    assert reply.status.code == 429
    assert ("x-llm-d-request-dropped-reason", "evicted") in [
        (o.header.key, o.header.raw_value.decode()) for o in reply.headers.set_headers
    ]
    assert events[1:] == [
        Rejected(429, "evicted", stream.request),
        Release(stream.request, None),
    ]
    assert stream.close() == []


def test_a_request_evicted_while_its_response_streams_is_released_with_its_usage():
    stream = machine(priority=-1)
    dispatch(stream)
    stream.receive(response_headers({"content-type": "application/json"}), 6.0)
    stream.receive(response_body(b'{"usage":{"prompt_tokens":3,', end_of_stream=False), 6.1)
    events = stream.evict()
    assert events[0].immediate_response.status.code == 429
    assert isinstance(events[-1], Release) and events[-1].request is stream.request


def test_eviction_before_dispatch_or_after_the_end_does_nothing():
    waiting = machine(priority=-1)
    admit(waiting)
    assert waiting.evict() == []
    over = machine(priority=-1)
    dispatch(over)
    over.close()
    assert over.evict() == []


class Gaps:
    def __init__(self) -> None:
        self.seen: list[float] = []
        self.asked_for = []

    def __call__(self, request):
        self.asked_for.append(request)
        return self

    def add(self, value: float) -> None:
        self.seen.append(value)


def test_the_gaps_between_sse_chunks_are_told_as_they_arrive():
    gaps = Gaps()
    stream = machine(chunk_gaps=gaps)
    dispatch(stream)
    stream.receive(response_headers({"content-type": "text/event-stream"}), 1.0)
    stream.receive(response_body(b"data: {}\n\n"), 2.0)
    stream.receive(response_body(b""), 2.1)  # an empty message is no chunk
    stream.receive(response_body(b"data: {}\n\n"), 2.5)
    assert gaps.seen == [0.5]
    stream.receive(response_body(b"data: [DONE]\n\n", end_of_stream=True), 2.75)
    assert gaps.seen == [0.5, 0.25]
    assert gaps.asked_for == [stream.request]


def test_a_json_response_has_no_chunk_gaps():
    gaps = Gaps()
    stream = machine(chunk_gaps=gaps)
    dispatch(stream)
    stream.receive(response_headers({"content-type": "application/json"}), 1.0)
    stream.receive(response_body(b'{"a":'), 2.0)
    stream.receive(response_body(b"1}", end_of_stream=True), 3.0)
    assert gaps.seen == []


def test_the_release_tells_the_cached_prompt_tokens():
    stream = machine()
    dispatch(stream)
    stream.receive(response_headers({"content-type": "application/json"}), 0.0)
    body = b'{"usage": {"prompt_tokens": 9, "completion_tokens": 4,'
    body += b' "prompt_tokens_details": {"cached_tokens": 8}}}'
    release = stream.receive(response_body(body, end_of_stream=True), 0.0)[1]
    assert release.usage == Usage(9, 4, cached_tokens=8)
