"""The ext_proc stream tells what the start of a response means: a
disaggregated request's prefill stage is over when the decode server's
response begins; a streamed response's first bytes say that its server runs
the request (the adaptive gate's `on_first_token`)."""

from __future__ import annotations

import json

from extproc_wire import request_body, request_headers, response_body, response_headers

from epp.extproc.events import AdmissionNeeded, FirstToken, PrefillDone
from epp.extproc.stream import ExtProcStream, StreamSettings
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.profiles import PREFILLER_HEADER

PREFILLER = "10.0.0.9:8000"
BODY = json.dumps({"model": "m", "prompt": "x" * 40, "max_tokens": 3}).encode()


def streamed_request(routing: dict[str, str] | None) -> tuple[ExtProcStream, FlowRequest]:
    stream = ExtProcStream(lambda headers: 0, StreamSettings(), lambda: "id")
    stream.receive(request_headers({":path": "/v1/completions", ":method": "POST"}), 0.0)
    (needed,) = stream.receive(request_body(BODY), 0.0)
    assert isinstance(needed, AdmissionNeeded)
    request = needed.request
    request.endpoint = "10.0.0.1:8000"
    request.payload.routing = routing
    stream.admitted(Outcome.DISPATCHED)
    return stream, request


def test_the_response_headers_of_a_disaggregated_request_end_its_prefill_stage():
    stream, request = streamed_request({PREFILLER_HEADER: PREFILLER})
    events = stream.receive(response_headers({"content-type": "application/json"}), 1.0)
    assert [e.request for e in events if isinstance(e, PrefillDone)] == [request]


def test_a_request_prefilled_where_it_decodes_has_no_prefill_stage_to_end():
    stream, _ = streamed_request(None)
    events = stream.receive(response_headers({"content-type": "application/json"}), 1.0)
    assert not [e for e in events if isinstance(e, PrefillDone)]


def first_tokens(events) -> list[FlowRequest]:
    return [e.request for e in events if isinstance(e, FirstToken)]


def test_the_first_bytes_of_a_streamed_response_say_its_server_runs_the_request():
    stream, request = streamed_request(None)
    stream.receive(response_headers({"content-type": "text/event-stream"}), 1.0)
    first = stream.receive(response_body(b'data: {"choices":[{"text":"a"}]}\n\n'), 1.1)
    later = stream.receive(response_body(b'data: {"choices":[{"text":"b"}]}\n\n'), 1.2)
    assert (first_tokens(first), first_tokens(later)) == ([request], [])


def test_a_whole_response_says_nothing_before_its_end():
    stream, _ = streamed_request(None)
    stream.receive(response_headers({"content-type": "application/json"}), 1.0)
    events = stream.receive(response_body(b'{"choices": []}', end_of_stream=True), 1.1)
    assert first_tokens(events) == []
