"""Saturation, one rule (the reference's utilization detector): an endpoint's
saturation is max(waiting / queue depth, KV use / KV threshold), stale
metrics count 1.0, saturated at 1.0; the pool's is the mean, an empty pool
is saturated. The filter, the utilization gate and the pool-saturation
gauge read it with the same thresholds and so agree."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.gate import AllGates, ConcurrencyGate, OpenGate
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.detectors import UtilizationDetector
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.saturation import (
    SaturationThresholds,
    UtilizationGate,
    gate_saturation,
    pool_saturation,
    unsaturated,
)

NOW = 10.0
DEFAULTS = SaturationThresholds()


def metrics(**values) -> EndpointMetrics:
    values.setdefault("updated_at", NOW)
    return EndpointMetrics(**values)


def endpoint(index: int, **values) -> Endpoint:
    return Endpoint(f"e{index}", f"10.0.0.{index}:8000", metrics=metrics(**values))


def pool_of(*endpoints: Endpoint, version: int = 1) -> PoolSnapshot:
    return PoolSnapshot(endpoints=endpoints, version=version, membership=1)


def gate_over(*endpoints: Endpoint, now: float = NOW) -> UtilizationGate:
    pool = pool_of(*endpoints)
    return UtilizationGate(lambda: pool, lambda: now)


def dispatched(endpoint: str) -> FlowRequest:
    request = FlowRequest("r", "f", 0, NOW)
    request.endpoint = endpoint
    return request


# -- the thresholds ----------------------------------------------------------------


def test_the_default_thresholds_are_the_references() -> None:
    assert (DEFAULTS.queue_depth, DEFAULTS.kv_cache, DEFAULTS.staleness) == (5, 0.8, 0.2)


@pytest.mark.parametrize("values", [(0, 0.8, 0.2), (5, 0.0, 0.2), (5, 0.8, -1.0)])
def test_thresholds_that_are_not_positive_are_refused(values: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="saturation thresholds must be positive"):
        SaturationThresholds(*values)


# -- one endpoint ---------------------------------------------------------------


def test_an_endpoints_saturation_is_the_larger_of_its_queue_and_kv_ratios() -> None:
    assert DEFAULTS.endpoint_saturation(metrics(waiting=1, kv_usage=0.4), NOW) == 0.5
    assert DEFAULTS.endpoint_saturation(metrics(waiting=4, kv_usage=0.4), NOW) == 0.8


def test_an_endpoint_with_metrics_older_than_the_staleness_counts_fully_saturated() -> None:
    assert DEFAULTS.endpoint_saturation(metrics(updated_at=NOW - 0.3), NOW) == 1.0


def test_metrics_exactly_as_old_as_the_staleness_are_still_fresh() -> None:
    quarter = SaturationThresholds(staleness=0.25)
    assert quarter.endpoint_saturation(metrics(updated_at=NOW - 0.25), NOW) == 0.0


def test_an_endpoint_never_read_counts_fully_saturated() -> None:
    assert DEFAULTS.endpoint_saturation(EndpointMetrics(), NOW) == 1.0


def test_an_endpoint_whose_latest_read_failed_counts_fully_saturated() -> None:
    assert DEFAULTS.endpoint_saturation(metrics(failing=True), NOW) == 1.0


# -- the pool --------------------------------------------------------------------


def test_the_pools_saturation_is_the_unweighted_mean_of_its_endpoints() -> None:
    pool = pool_of(endpoint(1, waiting=1, kv_usage=0.4), endpoint(2, waiting=4))
    assert pool_saturation(pool, NOW, DEFAULTS)[0] == pytest.approx((0.5 + 0.8) / 2)


def test_an_empty_pool_is_saturated() -> None:
    assert pool_saturation(pool_of(), NOW, DEFAULTS)[0] == 1.0


def test_the_pools_reading_holds_until_its_first_fresh_endpoint_turns_stale() -> None:
    pool = pool_of(
        endpoint(1, updated_at=NOW - 0.1), endpoint(2, waiting=9), endpoint(3, failing=True)
    )
    assert pool_saturation(pool, NOW, DEFAULTS)[1] == pytest.approx(NOW + 0.1)


# -- the saturation filter --------------------------------------------------------


def test_the_filter_keeps_endpoints_below_both_thresholds() -> None:
    kept, _ = unsaturated([endpoint(1, waiting=4, kv_usage=0.79)], NOW, DEFAULTS)
    assert [e.name for e in kept] == ["e1"]


def test_the_filter_drops_an_endpoint_at_either_threshold() -> None:
    at_queue, at_kv = endpoint(1, waiting=5), endpoint(2, kv_usage=0.8)
    assert unsaturated([at_queue, at_kv], NOW, DEFAULTS)[0] == []


def test_the_filter_drops_endpoints_with_stale_metrics() -> None:
    assert unsaturated([endpoint(1, updated_at=NOW - 1.0)], NOW, DEFAULTS)[0] == []


def test_headroom_lets_the_filter_keep_endpoints_above_the_thresholds() -> None:
    kept, _ = unsaturated([endpoint(1, waiting=6)], NOW, DEFAULTS, headroom=0.4)
    assert [e.name for e in kept] == ["e1"]


def test_the_filters_answer_holds_until_a_kept_endpoint_turns_stale() -> None:
    endpoints = [endpoint(1, updated_at=NOW - 0.15), endpoint(2, waiting=9, updated_at=NOW - 0.19)]
    assert unsaturated(endpoints, NOW, DEFAULTS)[1] == pytest.approx(NOW + 0.05)


# -- the utilization gate -----------------------------------------------------------


def test_an_idle_pool_opens_the_utilization_gate() -> None:
    assert gate_over(endpoint(1), endpoint(2)).is_open(0)


def test_a_pool_at_saturation_one_closes_the_utilization_gate() -> None:
    assert not gate_over(endpoint(1, waiting=5), endpoint(2, kv_usage=0.8)).is_open(0)


def test_metrics_turning_stale_close_the_gate_without_a_new_snapshot() -> None:
    pool = pool_of(endpoint(1))
    clock = [NOW]
    gate = UtilizationGate(lambda: pool, lambda: clock[0])
    assert gate.is_open(0)
    clock[0] = NOW + 0.3
    assert not gate.is_open(0)


def test_a_new_snapshot_reopens_the_gate() -> None:
    pools = [pool_of(endpoint(1, waiting=9))]
    gate = UtilizationGate(lambda: pools[0], lambda: NOW)
    assert not gate.is_open(0)
    pools[0] = pool_of(endpoint(1, waiting=1), version=2)
    assert gate.is_open(0)


def test_retuned_thresholds_apply_to_the_same_snapshot() -> None:
    gate = gate_over(endpoint(1, waiting=6))
    assert not gate.is_open(0)
    gate.retune(SaturationThresholds(queue_depth=10))
    assert gate.saturation() == pytest.approx(0.6)


# -- the pool-saturation gauge ----------------------------------------------------


def test_the_gauge_of_an_empty_pool_is_saturated() -> None:
    assert gate_saturation(OpenGate(), pool_of()) == 1.0


def test_the_gauge_of_a_gate_that_reads_nothing_is_zero() -> None:
    assert gate_saturation(OpenGate(), pool_of(endpoint(1, waiting=50))) == 0.0


def test_the_gauge_reads_the_utilization_gate() -> None:
    gate = gate_over(endpoint(1, waiting=1), endpoint(2, waiting=3))
    assert gate_saturation(gate, pool_of(endpoint(1), endpoint(2))) == pytest.approx(0.4)


def test_the_gauge_reads_fixed_credits_in_flight_over_the_endpoints_limits() -> None:
    credits = ConcurrencyGate(max_per_endpoint=4)
    credits.on_dispatch(dispatched("10.0.0.1:8000"))
    assert gate_saturation(credits, pool_of(endpoint(1), endpoint(2))) == 1 / 8


def test_the_gauge_reads_in_flight_over_the_pools_limit() -> None:
    credits = ConcurrencyGate(max_in_flight=2)
    credits.on_dispatch(dispatched("10.0.0.1:8000"))
    assert gate_saturation(credits, pool_of(endpoint(1))) == 0.5


def test_the_gauge_reads_in_flight_over_the_learned_limits() -> None:
    pool = pool_of(endpoint(1), endpoint(2))
    adaptive = AdaptiveGate(lambda: pool, lambda: NOW)
    adaptive.on_dispatch(dispatched("10.0.0.1:8000"))
    total = adaptive.limit_of("10.0.0.1:8000") + adaptive.limit_of("10.0.0.2:8000")
    assert gate_saturation(adaptive, pool) == 1 / total


def test_the_gauge_of_combined_gates_is_the_largest_of_their_readings() -> None:
    pool = pool_of(endpoint(1, waiting=1))
    credits = ConcurrencyGate(max_in_flight=2)
    credits.on_dispatch(dispatched("10.0.0.1:8000"))
    gate = AllGates([credits, UtilizationGate(lambda: pool, lambda: NOW)])
    assert gate_saturation(gate, pool) == 0.5


# -- the readers agree ------------------------------------------------------------

endpoint_metrics = st.builds(
    EndpointMetrics,
    waiting=st.integers(0, 12) | st.floats(0, 12),
    kv_usage=st.floats(0, 1) | st.sampled_from([0.79, 0.8, 0.81]),
    updated_at=st.none() | st.floats(NOW - 0.5, NOW),
    failing=st.booleans(),
)
thresholds = st.builds(
    SaturationThresholds,
    queue_depth=st.integers(1, 10) | st.floats(0.5, 10),
    kv_cache=st.floats(0.05, 1.0) | st.just(0.8),
    staleness=st.sampled_from([0.0, 0.1, 0.2, 0.5]),
)


@given(st.lists(endpoint_metrics, min_size=1, max_size=6), thresholds)
def test_the_filter_the_gate_and_the_gauge_agree_on_which_endpoints_are_saturated(
    values: list[EndpointMetrics], limits: SaturationThresholds
) -> None:
    endpoints = [Endpoint(f"e{i}", f"10.0.0.{i}:8000", metrics=m) for i, m in enumerate(values)]
    kept, _ = unsaturated(endpoints, NOW, limits)
    detector = UtilizationDetector(limits)
    for one in endpoints:
        alone = pool_of(one)
        gate = UtilizationGate(lambda alone=alone: alone, lambda: NOW, limits)
        saturated = one not in kept
        assert (not gate.is_open(0)) is saturated
        assert (gate_saturation(gate, alone) >= 1.0) is saturated
        assert (not detector.admits(one, NOW, {})) is saturated
    pool = pool_of(*endpoints)
    gate = UtilizationGate(lambda: pool, lambda: NOW, limits)
    assert gate_saturation(gate, pool) == gate.saturation() == detector.saturation(pool, NOW, {})[0]
