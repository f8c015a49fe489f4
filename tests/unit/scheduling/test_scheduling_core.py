"""`build_core` and `build_gate`: the configured gate, its credits, and the
one set of saturation thresholds reaching the utilization gate, also after a
reload."""

from __future__ import annotations

import random

import pytest

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.config import FlowControlConfig, GateConfig, GateKind
from epp.flowcontrol.gate import AllGates, ConcurrencyGate, OpenGate
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.core import build_core, build_gate
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.saturation import SaturationThresholds, UtilizationGate

NOW = 10.0
UTILIZATION = frozenset({GateKind.UTILIZATION})


def no_pool() -> PoolSnapshot:
    return PoolSnapshot()


def test_the_default_config_builds_the_adaptive_gate() -> None:
    gate, credits = build_gate(GateConfig(), no_pool, lambda: NOW)
    assert isinstance(gate, AdaptiveGate)
    assert gate is credits


def test_the_concurrency_kind_builds_fixed_credits() -> None:
    config = GateConfig(kinds=frozenset({GateKind.CONCURRENCY}), max_per_endpoint=4)
    gate, concurrency = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(gate, ConcurrencyGate)
    assert gate is concurrency
    assert concurrency.max_per_endpoint == 4


def test_with_the_adaptive_kind_the_concurrency_kind_keeps_only_its_pool_limit() -> None:
    config = GateConfig(
        kinds=frozenset({GateKind.ADAPTIVE, GateKind.CONCURRENCY}),
        max_in_flight=5,
        max_per_endpoint=4,
    )
    gate, credits = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(credits, AdaptiveGate) and isinstance(gate, AllGates)
    concurrency = next(g for g in gate.gates if isinstance(g, ConcurrencyGate))
    assert (concurrency.max_in_flight, concurrency.max_per_endpoint) == (5, 0)


def test_the_utilization_kind_alone_has_no_credits() -> None:
    gate, credits = build_gate(GateConfig(kinds=UTILIZATION), no_pool, lambda: NOW)
    assert isinstance(gate, UtilizationGate)
    assert credits is None


def test_the_utilization_kind_reads_the_thresholds_it_is_given() -> None:
    thresholds = SaturationThresholds(queue_depth=3)
    gate, _ = build_gate(GateConfig(kinds=UTILIZATION), no_pool, lambda: NOW, thresholds)
    assert isinstance(gate, UtilizationGate) and gate.thresholds is thresholds


def test_both_kinds_combine_and_close_when_either_closes() -> None:
    config = GateConfig(
        kinds=frozenset({GateKind.CONCURRENCY, GateKind.UTILIZATION}), max_in_flight=5
    )
    gate, concurrency = build_gate(config, no_pool, lambda: NOW)
    assert isinstance(gate, AllGates)
    assert concurrency in gate.gates
    assert not gate.is_open(0)  # the empty pool is saturated


def test_no_kinds_build_a_gate_that_never_closes() -> None:
    gate, concurrency = build_gate(GateConfig(kinds=frozenset()), no_pool, lambda: NOW)
    assert isinstance(gate, OpenGate)
    assert concurrency is None


POOL = PoolSnapshot(
    (Endpoint("e", "10.0.0.1:8000", metrics=EndpointMetrics(waiting=6, updated_at=NOW)),), 1, 1
)


def utilization_core(scheduling: SchedulingConfig):
    flow = FlowControlConfig(gate=GateConfig(kinds=UTILIZATION))
    return build_core(flow, scheduling, lambda: POOL, lambda: NOW, random.Random(0))


def test_the_core_reads_utilization_against_the_saturation_filters_thresholds() -> None:
    core = utilization_core(SchedulingConfig(saturation=SaturationThresholds(queue_depth=12)))
    assert core.saturation() == pytest.approx(0.5)


def test_a_reload_moves_the_utilization_gate_to_the_new_thresholds() -> None:
    core = utilization_core(SchedulingConfig())
    assert core.saturation() == pytest.approx(1.2)
    core.reschedule(
        SchedulingConfig(saturation=SaturationThresholds(queue_depth=12)), random.Random(0)
    )
    assert core.saturation() == pytest.approx(0.5)
    assert core.gate.is_open(0)
