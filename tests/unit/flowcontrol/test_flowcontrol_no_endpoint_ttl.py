"""The empty-pool regime: `noEndpointRequestTTL` replaces the TTL while the
pool has no endpoint, and each change of regime restarts the budgets (the
reference's `isExpired`, `pkg/epp/flowcontrol/controller/internal/processor.go`)."""

from __future__ import annotations

from epp.flowcontrol.config import BandConfig
from epp.flowcontrol.outcome import Outcome
from tests.unit.flowcontrol.flowcontrol_support import Credits, Placer, controller, request


def empty_pool() -> Placer:
    return Placer(lambda r: None, endpoints=False)


def test_a_request_queued_on_an_empty_pool_waits_the_no_endpoint_ttl():
    core = controller(gate=Credits(), placer=empty_pool(), default_ttl=60.0, no_endpoint_ttl=5.0)
    waiting = request()
    core.enqueue_and_dispatch(waiting, 0.0)
    assert core.next_wakeup() == 5.0
    assert core.poke(5.0) == [waiting]
    assert waiting.outcome is Outcome.REJECTED_NO_ENDPOINTS


def test_the_no_endpoint_ttl_follows_the_default_ttl_when_unset():
    core = controller(gate=Credits(), placer=empty_pool(), default_ttl=10.0)
    core.enqueue_and_dispatch(request(), 0.0)
    assert core.next_wakeup() == 10.0


def test_a_zero_no_endpoint_ttl_lets_a_request_wait_for_endpoints_without_limit():
    core = controller(gate=Credits(), placer=empty_pool(), default_ttl=10.0, no_endpoint_ttl=0.0)
    waiting = request()
    core.enqueue_and_dispatch(waiting, 0.0)
    assert core.next_wakeup() is None
    assert core.poke(1e6) == []


def test_a_request_keeps_its_own_shorter_ttl_on_an_empty_pool():
    core = controller(gate=Credits(), placer=empty_pool(), no_endpoint_ttl=30.0)
    core.enqueue_and_dispatch(request(ttl=2.0), 0.0)
    assert core.next_wakeup() == 2.0


def test_endpoints_appearing_start_the_ttl_afresh():
    placer = empty_pool()
    core = controller(gate=Credits(0), placer=placer, default_ttl=10.0, no_endpoint_ttl=100.0)
    waiting = request()
    core.enqueue_and_dispatch(waiting, 0.0)
    placer.endpoints = True
    assert core.poke(50.0) == []
    assert core.next_wakeup() == 60.0
    assert core.poke(60.0) == [waiting]
    assert waiting.outcome is Outcome.REJECTED_TTL_EXPIRED


def test_the_pool_emptying_starts_the_no_endpoint_ttl_afresh():
    placer = Placer(lambda r: None)
    core = controller(gate=Credits(), placer=placer, default_ttl=10.0, no_endpoint_ttl=30.0)
    waiting = request()
    core.enqueue_and_dispatch(waiting, 0.0)
    placer.endpoints = False
    assert core.poke(5.0) == []
    assert core.next_wakeup() == 35.0


def test_a_full_queue_on_an_empty_pool_rejects_with_no_endpoints():
    core = controller(
        gate=Credits(), placer=empty_pool(), default_band=BandConfig(priority=0, max_requests=1)
    )
    core.enqueue_and_dispatch(request(), 0.0)
    refused = request()
    outcome, _ = core.enqueue_and_dispatch(refused, 0.0)
    assert outcome is Outcome.REJECTED_NO_ENDPOINTS
