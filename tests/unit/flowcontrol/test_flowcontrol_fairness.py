"""Fair sharing inside a band: round-robin, vtc and global-strict."""

from __future__ import annotations

from flowcontrol_support import Credits, controller, dispatch_one, enqueue_all, request, tenants

from epp.flowcontrol.config import BandConfig, Fairness
from epp.flowcontrol.request import Usage


def band(fairness: Fairness, **fields) -> BandConfig:
    return BandConfig(priority=0, fairness=fairness, **fields)


def counter(core, fairness_id: str) -> float:
    return core.band(0).flows[fairness_id].counter


# -- round-robin ---------------------------------------------------------------


def test_round_robin_gives_backlogged_flows_one_turn_each():
    core = controller(band(Fairness.ROUND_ROBIN))
    enqueue_all(core, *(request(t) for t in "aaabbbc"))
    assert tenants(core.dispatch(0.0)) == list("abcabab")


def test_round_robin_turns_ignore_request_size():
    core = controller(band(Fairness.ROUND_ROBIN))
    enqueue_all(
        core,
        *(request("big", input_tokens=10_000) for _ in range(3)),
        *(request("small", input_tokens=1) for _ in range(3)),
    )
    assert tenants(core.dispatch(0.0)) == ["big", "small"] * 3


def test_round_robin_flow_that_empties_rejoins_at_the_back_of_the_ring():
    core = controller(band(Fairness.ROUND_ROBIN), gate=Credits(0))
    enqueue_all(core, request("a"), request("b"), request("b"), request("c"), request("c"))
    assert dispatch_one(core).fairness_id == "a"
    enqueue_all(core, request("a"))
    core.gate.credits = 10
    assert tenants(core.dispatch(0.0)) == list("bcabc")


# -- vtc -------------------------------------------------------------------------


def test_vtc_dispatches_the_least_served_backlogged_flow_first():
    core = controller(band(Fairness.VTC))
    enqueue_all(
        core,
        request("a", input_tokens=100),
        request("a", input_tokens=100),
        request("b", input_tokens=10),
        request("b", input_tokens=10),
    )
    assert tenants(core.dispatch(0.0)) == ["a", "b", "b", "a"]


def test_vtc_charges_weighted_estimated_input_at_dispatch():
    core = controller(band(Fairness.VTC, input_weight=3.0))
    enqueue_all(core, request("a", input_tokens=100))
    core.dispatch(0.0)
    assert counter(core, "a") == 300.0


def test_vtc_corrects_input_and_charges_weighted_output_at_completion():
    core = controller(band(Fairness.VTC, input_weight=1.0, output_weight=2.0))
    served = request("a", input_tokens=100)
    enqueue_all(core, served)
    core.dispatch(0.0)
    core.complete(served, 1.0, Usage(80, 50))
    assert counter(core, "a") == 80 + 2 * 50


def test_vtc_keeps_the_estimate_when_completion_reports_no_usage():
    core = controller(band(Fairness.VTC, input_weight=1.0, output_weight=3.0))
    served = request("a", input_tokens=100)
    enqueue_all(core, served)
    core.dispatch(0.0)
    core.complete(served, 1.0, None)
    assert counter(core, "a") == 100


def test_vtc_completion_charge_reorders_backlogged_flows():
    """Before the completion `a` (counter 10) is behind `b` (50) and would go
    next; its output charge puts it at 210, so `b` goes first."""
    core = controller(band(Fairness.VTC, output_weight=2.0), gate=Credits(0))
    first = request("a", input_tokens=10)
    enqueue_all(
        core,
        first,
        request("a", input_tokens=10),
        request("b", input_tokens=50),
        request("b", input_tokens=10),
    )
    assert tenants([dispatch_one(core), dispatch_one(core)]) == ["a", "b"]
    assert (counter(core, "a"), counter(core, "b")) == (10.0, 50.0)
    core.complete(first, 1.0, Usage(10, 100))
    assert tenants([dispatch_one(core), dispatch_one(core)]) == ["b", "a"]


def test_vtc_completion_that_lowers_the_charge_reorders_backlogged_flows():
    """A real input smaller than the estimate lowers `a`'s counter below `b`'s."""
    core = controller(band(Fairness.VTC, output_weight=0.0), gate=Credits(0))
    first = request("a", input_tokens=100)
    enqueue_all(
        core,
        request("b", input_tokens=50),
        first,
        request("b", input_tokens=10),
        request("a", input_tokens=10),
    )
    assert tenants([dispatch_one(core), dispatch_one(core)]) == ["b", "a"]
    assert (counter(core, "a"), counter(core, "b")) == (100.0, 50.0)
    core.complete(first, 1.0, Usage(5, 0))
    assert tenants([dispatch_one(core), dispatch_one(core)]) == ["a", "b"]


def test_vtc_lifts_a_newly_backlogged_flow_to_the_smallest_backlogged_counter():
    core = controller(band(Fairness.VTC), gate=Credits(0))
    enqueue_all(core, request("a", input_tokens=100), request("b", input_tokens=300))
    dispatch_one(core)
    dispatch_one(core)
    enqueue_all(core, request("a"), request("b"))
    assert (counter(core, "a"), counter(core, "b")) == (100.0, 300.0)
    enqueue_all(core, request("c"))
    assert counter(core, "c") == 100.0


def test_vtc_never_lowers_the_counter_of_a_newly_backlogged_flow():
    core = controller(band(Fairness.VTC), gate=Credits(0))
    enqueue_all(core, request("a", input_tokens=500), request("b", input_tokens=100))
    dispatch_one(core)
    dispatch_one(core)
    enqueue_all(core, request("b"), request("a"))
    assert counter(core, "a") == 500.0


def test_vtc_lifts_to_the_counter_the_last_served_flow_was_chosen_at_when_none_is_backlogged():
    core = controller(band(Fairness.VTC), gate=Credits(0))
    enqueue_all(core, request("a", input_tokens=100), request("a", input_tokens=100))
    dispatch_one(core)
    dispatch_one(core)
    assert counter(core, "a") == 200.0
    enqueue_all(core, request("b"))
    assert counter(core, "b") == 100.0


def test_vtc_idle_time_banks_no_credit():
    core = controller(band(Fairness.VTC), gate=Credits(0))
    enqueue_all(core, request("quiet", input_tokens=10))
    dispatch_one(core)
    enqueue_all(core, *(request("busy", input_tokens=10) for _ in range(50)))
    for _ in range(40):
        dispatch_one(core)
    enqueue_all(core, *(request("quiet", input_tokens=10) for _ in range(10)))
    core.gate.credits = 6
    order = tenants(core.dispatch(0.0))
    assert order.count("busy") >= 2, order


# -- global-strict ---------------------------------------------------------------


def test_global_strict_serves_the_oldest_request_across_flows():
    core = controller(band(Fairness.GLOBAL_STRICT))
    enqueue_all(core, request("a"), request("a"), request("a"), request("b"), request("a"))
    assert tenants(core.dispatch(0.0)) == list("aaaba")


def test_global_strict_keeps_per_flow_counts():
    core = controller(band(Fairness.GLOBAL_STRICT), gate=Credits(0))
    enqueue_all(core, request("a", byte_size=5), request("b", byte_size=7), request("a"))
    flows = core.band(0).flows
    assert (flows["a"].count, flows["b"].count, core.band(0).bytes) == (2, 1, 12)


def test_vtc_counter_gap_stays_within_twice_the_charge_of_a_flows_requests_in_flight():
    core = controller(band(Fairness.VTC, input_weight=1.0, output_weight=2.0))
    enqueue_all(core, *(request(t, input_tokens=0) for t in "aaaabbbb"))
    core.gate.credits = 6
    dispatched = core.dispatch(0.0)
    assert tenants(dispatched) == list("ababab")
    for r in dispatched:
        if r.fairness_id == "a":
            core.complete(r, 1.0, Usage(r.input_tokens, 100))
    in_flight_charge = 3 * 2.0 * 100
    gap = abs(counter(core, "a") - counter(core, "b"))
    assert gap > 2 * 2.0 * 100
    assert gap <= 2 * in_flight_charge
