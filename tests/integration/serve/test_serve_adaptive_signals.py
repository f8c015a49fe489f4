"""The live server tells the adaptive gate what responses say: a streamed
response's first bytes take its request off its endpoint's pending budget,
and its time per output token is its endpoint's latency."""

from __future__ import annotations

import pytest

from epp.extproc.events import Release
from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.request import FlowRequest, State
from epp.serve.server import EppServer
from tests.support.serving import loopback_options

ENDPOINT = "127.0.0.1:1"


def sent(live: EppServer) -> FlowRequest:
    """A request the gate saw dispatched to ENDPOINT (pending there)."""
    request = FlowRequest("r", "f", 0, 0.0)
    request.endpoint, request.seq, request.state = ENDPOINT, 1, State.DISPATCHED
    live.credits.on_dispatch(request)
    return request


async def test_the_first_bytes_of_a_streamed_response_take_its_request_off_the_budget():
    live = EppServer(loopback_options(endpoints=ENDPOINT))
    assert isinstance(live.credits, AdaptiveGate)  # the default configuration's gate
    request = sent(live)
    live.service.on_first_token(request)
    assert request.running and live.credits._estimators[ENDPOINT].pending == 0


async def test_a_streamed_response_tells_its_endpoint_latency():
    live = EppServer(loopback_options(endpoints=ENDPOINT))
    request = sent(live)
    first = live.service.clock() - 0.4
    live.service.listener(Release(request, 10, 5, 100, first_byte_at=first, streaming=True))
    assert live.credits._estimators[ENDPOINT].itl == pytest.approx(0.1, rel=0.05)


def test_a_whole_response_tells_no_latency():
    release = Release(FlowRequest("r", "f", 0, 0.0), 10, 5, 100, first_byte_at=1.0)
    assert release.time_per_output_token(2.0) is None
