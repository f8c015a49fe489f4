"""Strict priority across bands, and what the placer's answer does to a pass."""

from __future__ import annotations

from flowcontrol_support import ENDPOINT, Credits, Placer, controller, enqueue_all, request

from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import State


def priorities(requests) -> list[int]:
    return [r.priority for r in requests]


def test_higher_bands_dispatch_first_whatever_the_arrival_order():
    core = controller()
    enqueue_all(core, request(priority=0), request(priority=5), request(priority=1))
    assert priorities(core.dispatch(0.0)) == [5, 1, 0]


def test_negative_priorities_rank_below_zero_and_by_value():
    core = controller()
    enqueue_all(
        core, request(priority=-10), request(priority=-1), request(priority=0), request(priority=-5)
    )
    assert priorities(core.dispatch(0.0)) == [0, -1, -5, -10]


def test_extreme_int32_priorities_are_ordered():
    core = controller()
    enqueue_all(core, request(priority=-(2**31)), request(priority=2**31 - 1))
    assert priorities(core.dispatch(0.0)) == [2**31 - 1, -(2**31)]


def test_priorities_lists_bands_highest_first():
    core = controller()
    enqueue_all(core, request(priority=3), request(priority=-2), request(priority=7))
    assert core.priorities == [7, 3, -2]


def test_a_lower_band_waits_while_a_higher_band_drains_the_credits():
    core = controller(gate=Credits(2))
    enqueue_all(core, request(priority=0), request(priority=9), request(priority=9))
    assert priorities(core.dispatch(0.0)) == [9, 9]
    assert core.band(0).count == 1


def test_a_gate_closed_for_a_higher_band_holds_the_lower_bands_too():
    class OpenBelowZero(Credits):
        def is_open(self, priority: int) -> bool:
            return priority < 0

    core = controller(gate=OpenBelowZero())
    enqueue_all(core, request(priority=1), request(priority=-1))
    assert core.dispatch(0.0) == []


def test_request_without_room_waits_and_nothing_lower_overtakes_it():
    held = request(priority=5)
    placer = Placer(lambda r: None if r is held else ENDPOINT)
    core = controller(placer=placer)
    lower = request(priority=0)
    enqueue_all(core, held, lower)
    assert core.dispatch(0.0) == []
    assert (held.state, lower.state) == (State.QUEUED, State.QUEUED)
    placer.decide = None
    assert core.dispatch(1.0) == [held, lower]


def test_request_without_room_also_holds_the_rest_of_its_band():
    held = request("a")
    core = controller(placer=Placer(lambda r: None if r is held else ENDPOINT))
    enqueue_all(core, held, request("b"))
    assert core.dispatch(0.0) == []
    assert core.band(0).count == 2


def test_placer_outcome_ends_the_request_with_it_and_the_pass_goes_on():
    doomed = request(priority=5, byte_size=10)
    core = controller(
        placer=Placer(lambda r: Outcome.REJECTED_NO_ENDPOINTS if r is doomed else ENDPOINT)
    )
    other = request(priority=0)
    enqueue_all(core, doomed, other)
    assert core.dispatch(0.0) == [doomed, other]
    assert (doomed.state, doomed.outcome, doomed.endpoint) == (
        State.DROPPED,
        Outcome.REJECTED_NO_ENDPOINTS,
        None,
    )
    assert (core.queued_requests, core.queued_bytes, core.in_flight) == (0, 0, 1)


def test_placer_outcome_takes_no_gate_credit():
    gate = Credits(1)
    doomed = request()
    placer = Placer(lambda r: Outcome.REJECTED_NO_ENDPOINTS if r is doomed else ENDPOINT)
    core = controller(gate=gate, placer=placer)
    kept = request()
    enqueue_all(core, doomed, kept)
    core.dispatch(0.0)
    assert gate.dispatched == [kept]


def test_dispatched_request_carries_its_state_outcome_and_endpoint():
    core = controller()
    r = request()
    enqueue_all(core, r)
    core.dispatch(4.5)
    assert (r.state, r.outcome, r.endpoint) == (State.DISPATCHED, Outcome.DISPATCHED, ENDPOINT)


def test_dispatch_with_nothing_queued_returns_nothing():
    assert controller().dispatch(0.0) == []
