"""TTL: default, band and request; the smallest positive wins; 0 disables."""

from __future__ import annotations

from flowcontrol_support import Credits, Placer, collected, controller, enqueue_all, request

from epp.flowcontrol.config import BandConfig
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import State


def expiry_time(*, arrival: float = 0.0, band_ttl=None, request_ttl=None, **config) -> float | None:
    core = controller(BandConfig(priority=0, ttl=band_ttl), gate=Credits(0), **config)
    enqueue_all(core, request(arrival=arrival, ttl=request_ttl), now=arrival)
    return core.next_deadline()


def test_default_ttl_is_sixty_seconds():
    assert expiry_time(arrival=10.0) == 70.0


def test_band_ttl_shorter_than_the_default_wins():
    assert expiry_time(band_ttl=5.0) == 5.0


def test_band_ttl_longer_than_the_default_does_not_extend_it():
    assert expiry_time(band_ttl=500.0) == 60.0


def test_request_ttl_shorter_than_band_and_default_wins():
    assert expiry_time(band_ttl=5.0, request_ttl=2.0) == 2.0


def test_request_ttl_longer_than_the_band_does_not_extend_it():
    assert expiry_time(band_ttl=5.0, request_ttl=50.0) == 5.0


def test_zero_default_ttl_disables_the_default():
    assert expiry_time(default_ttl=0.0) is None


def test_zero_default_ttl_leaves_band_and_request_ttls():
    assert expiry_time(default_ttl=0.0, band_ttl=9.0, request_ttl=20.0) == 9.0
    assert expiry_time(default_ttl=0.0, request_ttl=20.0) == 20.0


def test_zero_band_ttl_adds_no_limit_of_its_own():
    assert expiry_time(band_ttl=0.0) == 60.0


def test_zero_request_ttl_adds_no_limit_of_its_own():
    assert expiry_time(band_ttl=5.0, request_ttl=0.0) == 5.0


def test_expire_ends_a_request_exactly_at_its_deadline_not_before():
    core = controller(gate=Credits(0))
    r = request(arrival=100.0, ttl=0.25)
    enqueue_all(core, r, now=100.0)
    assert core.expire(100.24999) == []
    assert r.state is State.QUEUED
    assert core.expire(100.25) == [r]
    assert (r.state, r.outcome) == (State.DROPPED, Outcome.REJECTED_TTL_EXPIRED)


def test_a_request_taking_its_bands_ttl_expires_exactly_at_its_deadline_through_poke():
    core = controller(BandConfig(priority=0, ttl=0.25), gate=Credits(0))
    r = request(arrival=100.0)
    enqueue_all(core, r, now=100.0)
    assert core.next_wakeup() == 100.25
    assert core.poke(100.24999) == []
    assert r.state is State.QUEUED
    assert core.poke(100.25) == [r]
    assert (r.state, r.outcome) == (State.DROPPED, Outcome.REJECTED_TTL_EXPIRED)


def test_expire_ends_every_request_due_and_keeps_counts_exact():
    core = controller(gate=Credits(0))
    due = [request(arrival=0.0, ttl=t, byte_size=3) for t in (1.0, 2.0)]
    kept = request(arrival=0.0, ttl=10.0, byte_size=5)
    enqueue_all(core, *due, kept)
    assert sorted(core.expire(2.0), key=lambda r: r.deadline) == due
    assert (core.queued_requests, core.queued_bytes) == (1, 5)
    assert (core.band(0).count, core.band(0).bytes) == (1, 5)
    assert core.band(0).flows["tenant-a"].count == 1


def test_expired_request_is_never_dispatched():
    core = controller(gate=Credits(0))
    r = request(ttl=1.0)
    enqueue_all(core, r)
    core.expire(1.0)
    core.gate.credits = 1
    assert core.dispatch(1.0) == []


def test_dispatched_request_does_not_expire():
    core = controller()
    r = request(ttl=1.0)
    enqueue_all(core, r)
    core.dispatch(0.0)
    assert core.expire(5.0) == []
    assert r.outcome is Outcome.DISPATCHED


def test_next_deadline_is_the_earliest_among_queued_requests():
    core = controller(gate=Credits(0))
    enqueue_all(core, request(ttl=5.0), request(ttl=3.0), request(ttl=4.0))
    assert core.next_deadline() == 3.0


def test_next_deadline_skips_requests_that_left_the_queue():
    core = controller(gate=Credits(0))
    cancelled = request(ttl=1.0)
    dispatched = request("b", priority=1, ttl=2.0)
    enqueue_all(core, cancelled, dispatched, request(ttl=3.0))
    core.cancel(cancelled, 0.0)
    core.gate.credits = 1
    core.dispatch(0.0)
    assert core.next_deadline() == 3.0


def test_next_deadline_is_none_when_nothing_is_queued():
    core = controller()
    enqueue_all(core, request(ttl=1.0))
    core.dispatch(0.0)
    assert core.next_deadline() is None


def test_expiry_without_any_endpoint_reports_no_endpoints():
    core = controller(gate=Credits(0), placer=Placer(endpoints=False))
    r = request(ttl=1.0)
    core.enqueue_and_dispatch(r, 0.0)
    assert core.expire(1.0) == [r]
    assert r.outcome is Outcome.REJECTED_NO_ENDPOINTS


def core_after_collecting_a_band():
    """Bands 5 and 6 exist with empty deadline lanes; band 6 is then collected."""
    core = controller(gate=Credits(0), flow_idle_timeout=1.0)
    keeps_band_5 = request("keeper", priority=5, ttl=100.0)
    gone = request(priority=6, ttl=100.0)
    enqueue_all(core, keeps_band_5, gone)
    core.cancel(gone, 0.0)
    collected(core, 1.0)
    assert core.priorities == [5]
    return core, keeps_band_5


def test_requests_of_a_band_still_expire_after_another_band_is_collected():
    core, keeper = core_after_collecting_a_band()
    core.cancel(keeper, 2.0)
    r = request(priority=5, arrival=2.0)
    enqueue_all(core, r, now=2.0)
    assert core.next_deadline() == 62.0
    assert r in core.expire(62.0)


def test_collecting_bands_one_after_another_succeeds():
    core, keeper = core_after_collecting_a_band()
    takes_band_ttl = request(priority=5, arrival=2.0)
    enqueue_all(core, takes_band_ttl, now=2.0)
    core.cancel(takes_band_ttl, 2.0)
    core.cancel(keeper, 2.0)
    assert set(collected(core, 3.0)) == {FlowKey("keeper", 5), FlowKey("tenant-a", 5)}
