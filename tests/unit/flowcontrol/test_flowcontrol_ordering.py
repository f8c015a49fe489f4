"""Ordering inside a flow: fcfs, edf and slo-deadline."""

from __future__ import annotations

from flowcontrol_support import controller, enqueue_all, request

from epp.flowcontrol.config import BandConfig, Fairness, Ordering


def band(ordering: Ordering, fairness: Fairness = Fairness.ROUND_ROBIN, **fields) -> BandConfig:
    return BandConfig(priority=0, fairness=fairness, ordering=ordering, **fields)


def test_fcfs_dispatches_a_flow_in_arrival_order_whatever_the_deadlines():
    core = controller(band(Ordering.FCFS))
    first = request(arrival=0.0, ttl=50.0)
    second = request(arrival=1.0, ttl=1.0, ttft_slo=0.1)
    enqueue_all(core, first, second)
    assert core.dispatch(2.0) == [first, second]


def test_edf_dispatches_the_earliest_arrival_plus_ttl_first():
    core = controller(band(Ordering.EDF))
    late = request(arrival=0.0, ttl=30.0)
    early = request(arrival=1.0, ttl=5.0)
    default = request(arrival=2.0)
    enqueue_all(core, late, early, default)
    assert core.dispatch(3.0) == [early, late, default]


def test_edf_deadline_uses_the_effective_ttl_not_the_requested_one():
    core = controller(band(Ordering.EDF, ttl=10.0))
    asks_long = request(arrival=0.0, ttl=100.0)
    asks_medium = request(arrival=1.0, ttl=20.0)
    enqueue_all(core, asks_long, asks_medium)
    assert core.dispatch(2.0) == [asks_long, asks_medium]


def test_edf_puts_requests_without_deadline_last_in_arrival_order():
    core = controller(band(Ordering.EDF), default_ttl=0.0)
    first = request(arrival=0.0)
    second = request(arrival=1.0)
    bounded = request(arrival=2.0, ttl=100.0)
    enqueue_all(core, first, second, bounded)
    assert core.dispatch(3.0) == [bounded, first, second]


def test_edf_breaks_deadline_ties_by_arrival():
    core = controller(band(Ordering.EDF))
    first = request(arrival=0.0, ttl=10.0)
    second = request(arrival=5.0, ttl=5.0)
    enqueue_all(core, first, second)
    assert core.dispatch(6.0) == [first, second]


def test_slo_deadline_dispatches_the_earliest_arrival_plus_ttft_target_first():
    core = controller(band(Ordering.SLO_DEADLINE))
    relaxed = request(arrival=0.0, ttft_slo=10.0)
    urgent = request(arrival=1.0, ttft_slo=2.0)
    enqueue_all(core, relaxed, urgent)
    assert core.dispatch(2.0) == [urgent, relaxed]


def test_slo_deadline_falls_back_to_the_ttl_deadline_without_a_ttft_target():
    core = controller(band(Ordering.SLO_DEADLINE))
    relaxed = request(arrival=0.0, ttft_slo=10.0)
    urgent = request(arrival=1.0, ttft_slo=2.0)
    ttl_only = request(arrival=2.0, ttl=5.0)
    no_limit = request(arrival=3.0)
    enqueue_all(core, no_limit, relaxed, urgent, ttl_only)
    assert core.dispatch(4.0) == [urgent, ttl_only, relaxed, no_limit]


def test_deadline_orders_hold_across_flows_under_global_strict():
    core = controller(band(Ordering.EDF, fairness=Fairness.GLOBAL_STRICT))
    a = request("a", arrival=0.0, ttl=30.0)
    b = request("b", arrival=1.0, ttl=3.0)
    enqueue_all(core, a, b)
    assert core.dispatch(2.0) == [b, a]
