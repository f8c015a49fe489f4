"""The live end of a disaggregated request's prefill stage: the prefill
credit returns when the decode server's response begins, or after a
timeout, or at the latest when the request ends."""

from __future__ import annotations

from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.profiles import PREFILLER_HEADER
from epp.scheduling.request import InferenceRequest
from epp.scheduling.stages import PrefillCredits
from epp.serve.prefill_stage import PrefillStage
from tests.support.waiting import eventually

PREFILLER = "10.0.0.9:8000"


def dispatched(credits: PrefillCredits) -> FlowRequest:
    payload = InferenceRequest("m", "m", routing={PREFILLER_HEADER: PREFILLER})
    request = FlowRequest("r", "f", 0, 0.0, payload=payload)
    request.outcome = Outcome.DISPATCHED
    request.endpoint = "10.0.0.1:8000"
    credits.on_dispatch(request)
    return request


async def test_the_prefill_credit_returns_once_and_the_core_is_poked():
    credits, pokes = PrefillCredits(1), []
    stage = PrefillStage(credits, lambda: pokes.append(1), timeout_s=60.0)
    request = dispatched(credits)
    stage.on_outcome(request, 0.0)
    assert not credits.has_room(PREFILLER)
    stage.prefill_done(request)
    stage.prefill_done(request)
    assert credits.has_room(PREFILLER) and pokes == [1] and stage.timed == 0


async def test_without_a_response_the_credit_returns_after_the_timeout():
    credits, pokes = PrefillCredits(1), []
    stage = PrefillStage(credits, lambda: pokes.append(1), timeout_s=0.01)
    stage.on_outcome(dispatched(credits), 0.0)
    await eventually(lambda: credits.has_room(PREFILLER))
    assert pokes == [1]


async def test_a_request_that_ends_drops_its_timer():
    credits = PrefillCredits(1)
    stage = PrefillStage(credits, lambda: None, timeout_s=60.0)
    request = dispatched(credits)
    stage.on_outcome(request, 0.0)
    credits.on_complete(request)
    stage.on_complete(request)
    assert stage.timed == 0 and credits.has_room(PREFILLER)
