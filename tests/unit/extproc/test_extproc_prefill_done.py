"""The ext_proc stream tells when a disaggregated request's prefill stage
is over: when the decode server's response begins."""

from __future__ import annotations

import json

from extproc_wire import request_body, request_headers, response_headers

from epp.extproc.events import AdmissionNeeded, PrefillDone
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
