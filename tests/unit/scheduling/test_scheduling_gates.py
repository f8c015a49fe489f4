import pytest

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.config import GateConfig, GateKind
from epp.flowcontrol.gate import AllGates, ConcurrencyGate, OpenGate
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.gates import UtilizationGate, build_gate

NOW = 10.0


def endpoint(index: int, **metrics) -> Endpoint:
    metrics.setdefault("updated_at", NOW)
    return Endpoint(f"e{index}", f"10.0.0.{index}:8000", metrics=EndpointMetrics(**metrics))


def gate_over(*endpoints: Endpoint, now: float = NOW) -> UtilizationGate:
    pool = PoolSnapshot(endpoints=endpoints, version=1, membership=1)
    return UtilizationGate(lambda: pool, lambda: now)


def test_saturation_is_the_mean_of_the_worse_of_queue_and_kv():
    gate = gate_over(endpoint(1, waiting=1, kv_usage=0.4), endpoint(2, waiting=4, kv_usage=0.0))
    assert gate.saturation() == pytest.approx((0.5 + 0.8) / 2)


def test_an_idle_pool_is_open():
    assert gate_over(endpoint(1), endpoint(2)).is_open(0)


def test_a_pool_at_its_thresholds_is_closed():
    assert not gate_over(endpoint(1, waiting=5), endpoint(2, kv_usage=0.8)).is_open(0)


def test_stale_metrics_count_as_saturated():
    gate = gate_over(endpoint(1), endpoint(2, updated_at=NOW - 1.0))
    assert gate.saturation() == pytest.approx(0.5)


def test_missing_and_failing_metrics_count_as_saturated():
    gate = gate_over(endpoint(1, updated_at=None), endpoint(2, failing=True))
    assert not gate.is_open(0)


def test_an_empty_pool_is_saturated():
    assert gate_over().saturation() == 1.0


def test_metrics_turning_stale_close_the_gate_without_a_new_snapshot():
    pool = PoolSnapshot(endpoints=(endpoint(1),), version=1, membership=1)
    clock = [NOW]
    gate = UtilizationGate(lambda: pool, lambda: clock[0], staleness=0.2)
    assert gate.is_open(0)
    clock[0] = NOW + 0.3
    assert not gate.is_open(0)


def test_a_new_snapshot_reopens_the_gate():
    pools = [PoolSnapshot(endpoints=(endpoint(1, waiting=9),), version=1, membership=1)]
    gate = UtilizationGate(lambda: pools[0], lambda: NOW)
    assert not gate.is_open(0)
    pools[0] = PoolSnapshot(endpoints=(endpoint(1, waiting=1),), version=2, membership=1)
    assert gate.is_open(0)


def test_non_positive_thresholds_are_a_clear_error():
    with pytest.raises(ValueError, match="thresholds must be positive"):
        UtilizationGate(PoolSnapshot, lambda: NOW, queue_depth_threshold=0)


def no_pool() -> PoolSnapshot:
    return PoolSnapshot()


def test_the_default_config_builds_the_adaptive_gate():
    gate, credits = build_gate(GateConfig(), no_pool, lambda: NOW)
    assert isinstance(gate, AdaptiveGate)
    assert gate is credits


def test_the_concurrency_kind_builds_fixed_credits():
    config = GateConfig(kinds=frozenset({GateKind.CONCURRENCY}), max_per_endpoint=4)
    gate, concurrency = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(gate, ConcurrencyGate)
    assert gate is concurrency
    assert concurrency.max_per_endpoint == 4


def test_with_the_adaptive_kind_the_concurrency_kind_keeps_only_its_pool_limit():
    config = GateConfig(
        kinds=frozenset({GateKind.ADAPTIVE, GateKind.CONCURRENCY}),
        max_in_flight=5,
        max_per_endpoint=4,
    )
    gate, credits = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(credits, AdaptiveGate)
    concurrency = next(g for g in gate.gates if isinstance(g, ConcurrencyGate))
    assert (concurrency.max_in_flight, concurrency.max_per_endpoint) == (5, 0)


def test_the_utilization_kind_alone_has_no_credits():
    config = GateConfig(kinds=frozenset({GateKind.UTILIZATION}), queue_depth_threshold=3)
    gate, concurrency = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(gate, UtilizationGate)
    assert gate.queue_depth_threshold == 3
    assert concurrency is None


def test_both_kinds_combine_and_close_when_either_closes():
    config = GateConfig(
        kinds=frozenset({GateKind.CONCURRENCY, GateKind.UTILIZATION}), max_in_flight=5
    )
    gate, concurrency = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(gate, AllGates)
    assert concurrency in gate.gates
    assert not gate.is_open(0)


def test_no_kinds_build_a_gate_that_never_closes():
    gate, concurrency = build_gate(GateConfig(kinds=frozenset()), no_pool, lambda: NOW)
    assert isinstance(gate, OpenGate)
    assert concurrency is None
