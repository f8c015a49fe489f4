"""A request's life after enqueue: cancel, complete, drain; and the life of
flows and bands: idle collection, ensure_bands, reconfigure."""

from __future__ import annotations

import pytest
from flowcontrol_support import Credits, collected, controller, enqueue_all, request, tenants

from epp.flowcontrol.config import BandConfig, Fairness, FlowControlConfig, Ordering
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import State


def counts(core, priority: int = 0, fairness_id: str = "tenant-a") -> tuple:
    band = core.band(priority)
    flow = band.flows[fairness_id]
    return (core.queued_requests, core.queued_bytes, band.count, band.bytes, flow.count)


# -- enqueue -------------------------------------------------------------------


def test_enqueueing_a_request_twice_is_an_error():
    core = controller(gate=Credits(0))
    r = request()
    enqueue_all(core, r)
    with pytest.raises(ValueError, match=r.request_id):
        core.enqueue(r, 0.0)
    assert core.queued_requests == 1


def test_enqueue_counts_the_request_everywhere():
    core = controller(gate=Credits(0))
    enqueue_all(core, request(byte_size=7), request(byte_size=5))
    assert counts(core) == (2, 12, 2, 12, 2)


# -- cancel ----------------------------------------------------------------------


def test_cancel_removes_a_queued_request_with_every_count_exact():
    core = controller(gate=Credits(0))
    kept, gone = request(byte_size=7), request(byte_size=5)
    enqueue_all(core, kept, gone)
    assert core.cancel(gone, 1.0) == [gone]
    assert (gone.state, gone.outcome) == (State.DROPPED, Outcome.CANCELLED)
    assert counts(core) == (1, 7, 1, 7, 1)


def test_cancelled_request_in_the_middle_is_skipped_by_dispatch():
    core = controller(gate=Credits(0))
    first, middle, last = request(), request(), request()
    enqueue_all(core, first, middle, last)
    core.cancel(middle, 0.0)
    core.gate.credits = 10
    assert core.dispatch(0.0) == [first, last]


@pytest.mark.parametrize("ordering", list(Ordering))
@pytest.mark.parametrize("fairness", list(Fairness))
def test_cancelling_many_keeps_counts_exact_under_every_policy(fairness, ordering):
    core = controller(BandConfig(priority=0, fairness=fairness, ordering=ordering), gate=Credits(0))
    queued = [request(f"t{i % 7}", byte_size=1, ttl=float(i % 13 + 1)) for i in range(500)]
    enqueue_all(core, *queued)
    for r in queued[::3]:
        core.cancel(r, 0.0)
    left = [r for r in queued if r.state is State.QUEUED]
    assert (core.queued_requests, core.band(0).count, core.band(0).bytes) == (len(left),) * 3
    core.gate.credits = 1000
    assert sorted(core.dispatch(0.0), key=lambda r: r.seq) == left


def test_cancel_of_a_dispatched_request_settles_nothing():
    core = controller()
    r = request()
    enqueue_all(core, r)
    core.dispatch(0.0)
    assert core.cancel(r, 0.0) == []
    assert (r.state, core.in_flight) == (State.DISPATCHED, 1)


def test_cancel_settles_nothing_the_second_time():
    core = controller(gate=Credits(0))
    r = request()
    enqueue_all(core, r)
    core.cancel(r, 0.0)
    assert core.cancel(r, 0.0) == []
    assert r.outcome is Outcome.CANCELLED


def test_cancel_settles_nothing_for_a_request_never_enqueued():
    assert controller().cancel(request(), 0.0) == []


# -- complete --------------------------------------------------------------------


def test_complete_releases_the_in_flight_credit_once():
    gate = Credits()
    core = controller(gate=gate)
    r = request()
    enqueue_all(core, r)
    core.dispatch(0.0)
    assert core.in_flight == 1
    assert core.complete(r, 1.0) == []
    assert (r.state, r.outcome, core.in_flight) == (State.COMPLETED, Outcome.DISPATCHED, 0)
    assert core.complete(r, 2.0) == []
    assert (core.in_flight, gate.completed) == (0, [r])


def test_complete_of_a_queued_request_changes_nothing():
    core = controller(gate=Credits(0))
    r = request()
    enqueue_all(core, r)
    assert core.complete(r, 0.0) == []
    assert (r.state, core.queued_requests, core.in_flight) == (State.QUEUED, 1, 0)


def test_complete_counts_the_flow_in_flight():
    core = controller()
    rs = [request(), request()]
    enqueue_all(core, *rs)
    core.dispatch(0.0)
    flow = core.band(0).flows["tenant-a"]
    assert flow.in_flight == 2
    core.complete(rs[0], 1.0)
    assert flow.in_flight == 1


# -- idle flows and bands ------------------------------------------------------


def idle_core(**config):
    return controller(BandConfig(priority=0), flow_idle_timeout=10.0, **config)


def test_flow_is_collected_after_the_idle_timeout_not_before():
    core = idle_core()
    r = request()
    enqueue_all(core, r)
    core.dispatch(0.0)
    core.complete(r, 5.0)
    assert core.next_wakeup() == 15.0
    assert collected(core, 14.99) == []
    assert collected(core, 15.0) == [FlowKey("tenant-a", 0)]
    assert core.band(0).flows == {}


def test_flow_with_queued_requests_is_not_collected():
    core = idle_core(gate=Credits(0))
    gone, waiting = request(), request()
    enqueue_all(core, gone, waiting)
    core.cancel(gone, 0.0)
    assert collected(core, 1000.0) == []
    assert "tenant-a" in core.band(0).flows


def test_flow_with_requests_in_flight_is_not_collected():
    core = idle_core(gate=Credits(1))
    gone, running = request(), request("tenant-a")
    enqueue_all(core, gone)
    core.cancel(gone, 0.0)
    enqueue_all(core, running)
    core.dispatch(0.0)
    assert collected(core, 1000.0) == []
    core.complete(running, 1000.0)
    assert collected(core, 1010.0) == [FlowKey("tenant-a", 0)]


def test_flow_busy_again_restarts_its_idle_time():
    core = idle_core()
    first, second = request(), request()
    enqueue_all(core, first)
    core.dispatch(0.0)
    core.complete(first, 0.0)
    enqueue_all(core, second, now=5.0)
    core.dispatch(5.0)
    core.complete(second, 8.0)
    assert collected(core, 10.0) == []
    assert collected(core, 18.0) == [FlowKey("tenant-a", 0)]


def test_collected_flow_starts_afresh_when_it_comes_back():
    core = controller(BandConfig(priority=0, fairness=Fairness.VTC), flow_idle_timeout=1.0)
    r = request(input_tokens=100)
    enqueue_all(core, r)
    core.dispatch(0.0)
    core.complete(r, 0.0)
    collected(core, 1.0)
    enqueue_all(core, request(), now=2.0)
    flow = core.band(0).flows["tenant-a"]
    assert (flow.count, flow.in_flight) == (1, 0)


def test_configured_band_stays_when_its_flows_are_collected():
    core = idle_core(gate=Credits(0))
    r = request()
    enqueue_all(core, r)
    core.cancel(r, 0.0)
    collected(core, 10.0)
    assert core.priorities == [0]


def test_unconfigured_band_goes_with_its_last_flow():
    core = idle_core(gate=Credits(0))
    r = request(priority=4)
    enqueue_all(core, r)
    core.cancel(r, 0.0)
    assert collected(core, 10.0) == [FlowKey("tenant-a", 4)]
    assert (core.priorities, core.band(4)) == ([0], None)


def test_ensured_band_stays_when_its_flows_are_collected():
    core = idle_core(gate=Credits(0))
    core.ensure_bands([4])
    r = request(priority=4)
    enqueue_all(core, r)
    core.cancel(r, 0.0)
    collected(core, 10.0)
    assert core.priorities == [4, 0]


def test_request_rejected_at_a_new_priority_leaves_no_band_behind():
    core = idle_core(max_requests=1, gate=Credits(0))
    enqueue_all(core, request(priority=0))
    assert core.enqueue(request(priority=7), 0.0) is Outcome.REJECTED_SATURATED
    collected(core, 1000.0)
    assert core.priorities == [0]


# -- ensure_bands ------------------------------------------------------------------


def test_ensure_bands_creates_empty_bands_in_priority_order():
    core = controller()
    core.ensure_bands([-3, 10, 2])
    assert core.priorities == [10, 2, -3]
    assert core.band(2).count == 0


def test_ensure_bands_keeps_a_band_first_seen_in_traffic():
    core = controller(flow_idle_timeout=1.0, gate=Credits(0))
    r = request(priority=5)
    enqueue_all(core, r)
    core.ensure_bands([5])
    core.cancel(r, 0.0)
    collected(core, 1.0)
    assert 5 in core.priorities


def test_ensured_band_uses_the_default_band_template():
    core = controller(default_band=BandConfig(priority=0, max_requests=1), gate=Credits(0))
    core.ensure_bands([3])
    enqueue_all(core, request(priority=3))
    assert core.enqueue(request(priority=3), 0.0) is Outcome.REJECTED_SATURATED


# -- reconfigure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (Fairness.ROUND_ROBIN, Fairness.VTC),
        (Fairness.VTC, Fairness.GLOBAL_STRICT),
        (Fairness.GLOBAL_STRICT, Fairness.ROUND_ROBIN),
    ],
)
def test_reconfigure_to_another_policy_keeps_queued_requests_in_flow_order(before, after):
    core = controller(BandConfig(priority=0, fairness=before), gate=Credits(0))
    queued = [request(t, byte_size=2) for t in "abcabcaab"]
    enqueue_all(core, *queued)
    core.reconfigure(FlowControlConfig(bands=(BandConfig(priority=0, fairness=after),)), 0.0)
    assert (core.queued_requests, core.band(0).count, core.band(0).bytes) == (9, 9, 18)
    core.gate.credits = 100
    dispatched = core.dispatch(0.0)
    assert sorted(dispatched, key=lambda r: r.seq) == queued
    for tenant in "abc":
        mine = [r for r in dispatched if r.fairness_id == tenant]
        assert mine == sorted(mine, key=lambda r: r.seq)


def test_reconfigure_takes_the_new_policy_for_the_next_dispatches():
    core = controller(BandConfig(priority=0, fairness=Fairness.ROUND_ROBIN), gate=Credits(0))
    enqueue_all(core, *(request(t) for t in "aaab"))
    core.reconfigure(
        FlowControlConfig(bands=(BandConfig(priority=0, fairness=Fairness.GLOBAL_STRICT),)), 0.0
    )
    core.gate.credits = 10
    assert tenants(core.dispatch(0.0)) == list("aaab")


def test_reconfigure_to_edf_orders_already_queued_requests_by_deadline():
    core = controller(BandConfig(priority=0), gate=Credits(0))
    late, early = request(ttl=30.0), request(ttl=3.0)
    enqueue_all(core, late, early)
    core.reconfigure(FlowControlConfig(bands=(BandConfig(priority=0, ordering=Ordering.EDF),)), 0.0)
    core.gate.credits = 10
    assert core.dispatch(0.0) == [early, late]


def test_reconfigure_lowers_a_band_limit_for_later_enqueues():
    core = controller(BandConfig(priority=0, max_requests=5), gate=Credits(0))
    enqueue_all(core, request(), request())
    core.reconfigure(FlowControlConfig(bands=(BandConfig(priority=0, max_requests=2),)), 0.0)
    assert core.enqueue(request(), 0.0) is Outcome.REJECTED_SATURATED
    assert core.queued_requests == 2


def test_reconfigure_raises_the_global_limit():
    core = controller(max_requests=1, gate=Credits(0))
    enqueue_all(core, request())
    core.reconfigure(FlowControlConfig(max_requests=2), 0.0)
    assert core.enqueue(request(), 0.0) is None


def test_reconfigure_adds_newly_configured_bands():
    core = controller()
    core.reconfigure(FlowControlConfig(bands=(BandConfig(priority=-4),)), 0.0)
    assert core.priorities == [-4]


# -- close and drain -------------------------------------------------------------------


def test_closed_controller_rejects_new_requests_as_shutting_down():
    core = controller()
    core.close()
    r = request()
    assert core.enqueue(r, 0.0) is Outcome.REJECTED_SHUTTING_DOWN
    assert (r.state, r.outcome, core.queued_requests) == (
        State.DROPPED,
        Outcome.REJECTED_SHUTTING_DOWN,
        0,
    )


def test_closed_controller_still_dispatches_what_is_queued():
    core = controller(gate=Credits(0))
    r = request()
    enqueue_all(core, r)
    core.close()
    core.gate.credits = 1
    assert core.dispatch(0.0) == [r]


def test_drain_ends_every_queued_request_with_the_outcome():
    core = controller(gate=Credits(1))
    running = request(priority=9)
    queued = [request("a", byte_size=3), request("b", priority=-1), request("a", priority=2)]
    enqueue_all(core, running, *queued)
    core.dispatch(0.0)
    core.close()
    ended = core.drain(Outcome.REJECTED_SHUTTING_DOWN, 1.0)
    assert sorted(ended, key=lambda r: r.seq) == queued
    assert {r.outcome for r in queued} == {Outcome.REJECTED_SHUTTING_DOWN}
    assert (core.queued_requests, core.queued_bytes, core.in_flight) == (0, 0, 1)
    assert [band.count for band in core.bands()] == [0, 0, 0, 0]
    assert running.state is State.DISPATCHED
