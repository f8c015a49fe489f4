"""utilization-detector and concurrency-detector: what they read, how a
configured one replaces the adaptive gate, and their filter role."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.request import FlowRequest
from epp.flowcontrol.usagelimits import DEFAULT_USAGE_LIMITS, PriorityHoldback, StaticUsageLimit
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.core import build_gate
from epp.scheduling.detectors import (
    ConcurrencyDetector,
    ConcurrencyMode,
    DetectorFilter,
    DetectorGate,
    MaxSaturationDetector,
    UtilizationDetector,
)
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.request import InferenceRequest
from epp.scheduling.saturation import SaturationThresholds
from epp.scheduling.scheduler import Scheduler

NOW = 50.0
HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def pool_of(*metrics: EndpointMetrics) -> PoolSnapshot:
    endpoints = tuple(
        Endpoint(f"e{i}", f"10.0.0.{i}:8000", metrics=m) for i, m in enumerate(metrics, 1)
    )
    return PoolSnapshot(endpoints, 1, 1)


def fresh(waiting: int = 0, kv: float = 0.0) -> EndpointMetrics:
    return EndpointMetrics(waiting, kv_usage=kv, updated_at=NOW)


def detector_config(plugin: dict, flow_control: dict | None = None, legacy: bool = False):
    document = {**HEAD, "plugins": [{"name": "d", **plugin}]}
    if legacy:
        document["saturationDetector"] = {"pluginRef": "d"}
    else:
        document["flowControl"] = {"saturationDetector": {"pluginRef": "d"}, **(flow_control or {})}
    return parse_config(document).flow_control.gate


def request(index: int, priority: int = 0, tokens: int = 0, endpoint: str | None = None):
    flow_request = FlowRequest(str(index), "t", priority, NOW, input_tokens=tokens)
    flow_request.endpoint = endpoint
    return flow_request


# -- parameters ---------------------------------------------------------------


def test_utilization_detector_defaults_are_the_references() -> None:
    gate = detector_config({"type": "utilization-detector"})
    assert gate.detector == UtilizationDetector(SaturationThresholds(5, 0.8, 0.2), 0.0)


def test_utilization_detector_parameters_are_read() -> None:
    parameters = {
        "queueDepthThreshold": 8,
        "kvCacheUtilThreshold": 1.0,
        "metricsStalenessThreshold": "1s",
        "headroom": 0.5,
    }
    gate = detector_config({"type": "utilization-detector", "parameters": parameters})
    assert gate.detector == UtilizationDetector(SaturationThresholds(8, 1.0, 1.0), 0.5)


@pytest.mark.parametrize(
    "parameters",
    [
        {"queueDepthThreshold": 0},
        {"kvCacheUtilThreshold": 0},
        {"kvCacheUtilThreshold": 1.5},
        {"metricsStalenessThreshold": "0s"},
        {"headroom": -0.1},
    ],
)
def test_utilization_detector_refuses_out_of_range_parameters(parameters: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(parameters))):
        detector_config({"type": "utilization-detector", "parameters": parameters})


def test_concurrency_detector_defaults_are_the_references() -> None:
    gate = detector_config({"type": "concurrency-detector"})
    assert gate.detector == ConcurrencyDetector(ConcurrencyMode.REQUESTS, 100, 1_000_000, 0.0)


def test_concurrency_detector_parameters_are_read() -> None:
    parameters = {
        "concurrencyMode": "hybrid",
        "maxConcurrency": 4,
        "maxTokenConcurrency": 900,
        "headroom": 0.25,
    }
    gate = detector_config({"type": "concurrency-detector", "parameters": parameters})
    assert gate.detector == ConcurrencyDetector(ConcurrencyMode.HYBRID, 4, 900, 0.25)


@pytest.mark.parametrize(
    "parameters",
    [
        {"concurrencyMode": "bytes"},
        {"maxConcurrency": 0},
        {"maxTokenConcurrency": 0},
        {"headroom": -1},
    ],
)
def test_concurrency_detector_refuses_out_of_range_parameters(parameters: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(parameters))):
        detector_config({"type": "concurrency-detector", "parameters": parameters})


# -- choosing the gate ----------------------------------------------------------


def test_without_a_detector_the_gate_is_the_adaptive_default() -> None:
    gate = parse_config({**HEAD}).flow_control.gate
    assert gate.detector is None and gate.usage_limits == DEFAULT_USAGE_LIMITS


def test_a_configured_detector_is_the_gate_with_the_references_static_ceiling() -> None:
    config = detector_config({"type": "concurrency-detector"})
    assert config.usage_limits == StaticUsageLimit(1.0)
    gate, credits = build_gate(config, lambda: pool_of(fresh()), lambda: NOW)
    assert isinstance(gate, DetectorGate) and credits is gate


def test_the_deprecated_top_level_saturation_detector_is_read() -> None:
    gate = detector_config({"type": "utilization-detector"}, legacy=True)
    assert gate.detector == UtilizationDetector()


def test_a_usage_limit_policy_sets_the_detector_ceilings() -> None:
    document = {
        **HEAD,
        "plugins": [
            {"name": "d", "type": "concurrency-detector"},
            {"name": "u", "type": "priority-holdback-policy", "parameters": {"minCeiling": 0.5}},
        ],
        "flowControl": {"saturationDetector": {"pluginRef": "d"}, "usageLimitPolicyPluginRef": "u"},
    }
    gate = parse_config(document).flow_control.gate
    assert gate.usage_limits == PriorityHoldback(0.5)


# -- utilization ---------------------------------------------------------------


def test_utilization_is_the_mean_of_each_endpoints_larger_ratio() -> None:
    pool = pool_of(fresh(waiting=5), fresh(kv=0.4))
    assert UtilizationDetector().saturation(pool, NOW, {})[0] == pytest.approx(0.75)


def test_stale_metrics_count_saturated() -> None:
    pool = pool_of(EndpointMetrics(updated_at=NOW - 1.0))
    assert UtilizationDetector().saturation(pool, NOW, {})[0] == 1.0


def test_utilization_filter_allows_the_headroom_above_the_thresholds() -> None:
    detector = UtilizationDetector(headroom=0.4)  # queue limit 7
    assert detector.admits(pool_of(fresh(waiting=6)).endpoints[0], NOW, {})
    assert not detector.admits(pool_of(fresh(waiting=7)).endpoints[0], NOW, {})


def test_utilization_filter_passes_everyone_when_no_endpoint_passes() -> None:
    pool = pool_of(fresh(waiting=9), fresh(kv=0.9))
    gate = DetectorGate(UtilizationDetector(), lambda: pool, lambda: NOW)
    assert gate.with_room(pool.endpoints) == pool.endpoints


def test_utilization_gate_closes_at_saturation_one() -> None:
    pool = pool_of(fresh(waiting=5))
    gate = DetectorGate(UtilizationDetector(), lambda: pool, lambda: NOW)
    assert not gate.is_open(0)


def test_with_staleness_policy_ignore_a_stale_endpoint_is_left_out_of_the_mean() -> None:
    pool = pool_of(fresh(waiting=1), EndpointMetrics(updated_at=NOW - 1.0))
    detector = UtilizationDetector(ignore_stale=True)
    assert detector.saturation(pool, NOW, {})[0] == pytest.approx(0.2)


def test_with_staleness_policy_ignore_an_all_stale_pool_reads_zero() -> None:
    pool = pool_of(EndpointMetrics(updated_at=NOW - 1.0), EndpointMetrics())
    assert UtilizationDetector(ignore_stale=True).saturation(pool, NOW, {})[0] == 0.0


def test_with_staleness_policy_ignore_an_empty_pool_is_still_saturated() -> None:
    assert UtilizationDetector(ignore_stale=True).saturation(PoolSnapshot(), NOW, {})[0] == 1.0


# -- concurrency ---------------------------------------------------------------


def test_requests_mode_is_in_flight_over_the_pools_capacity() -> None:
    detector = ConcurrencyDetector(max_concurrency=4)
    load = {A: (3, 0), B: (1, 0)}
    assert detector.saturation(pool_of(fresh(), fresh()), NOW, load)[0] == 0.5


def test_tokens_mode_counts_tokens() -> None:
    detector = ConcurrencyDetector(ConcurrencyMode.TOKENS, max_token_concurrency=100)
    load = {A: (1, 150), B: (1, 0)}
    assert detector.saturation(pool_of(fresh(), fresh()), NOW, load)[0] == 0.75


def test_hybrid_mode_sees_endpoints_saturated_on_different_dimensions() -> None:
    detector = ConcurrencyDetector(ConcurrencyMode.HYBRID, 4, 100)
    load = {A: (4, 0), B: (0, 100)}
    assert detector.saturation(pool_of(fresh(), fresh()), NOW, load)[0] == 1.0


def test_an_empty_pool_is_saturated() -> None:
    assert ConcurrencyDetector().saturation(PoolSnapshot(), NOW, {})[0] == 1.0


def test_the_gate_closes_when_the_pool_is_full_and_reopens_on_completion() -> None:
    pool = pool_of(fresh())
    gate = DetectorGate(ConcurrencyDetector(max_concurrency=2), lambda: pool, lambda: NOW)
    first, second = request(1, endpoint=A), request(2, endpoint=A)
    gate.on_dispatch(first)
    assert gate.is_open(0)
    gate.on_dispatch(second)
    assert not gate.is_open(0)
    gate.on_complete(first)
    assert gate.is_open(0)


def test_headroom_lets_an_endpoint_take_more_than_its_ideal_share() -> None:
    pool = pool_of(fresh())
    detector = ConcurrencyDetector(max_concurrency=2, headroom=0.5)  # limit 3
    gate = DetectorGate(detector, lambda: pool, lambda: NOW)
    for index in range(2):
        gate.on_dispatch(request(index, endpoint=A))
    assert gate.has_room(A)
    gate.on_dispatch(request(3, endpoint=A))
    assert not gate.has_room(A)


def test_the_tokens_counted_at_dispatch_are_the_ones_taken_back() -> None:
    pool = pool_of(fresh())
    detector = ConcurrencyDetector(ConcurrencyMode.TOKENS, max_token_concurrency=100)
    gate = DetectorGate(detector, lambda: pool, lambda: NOW)
    flow_request = request(1, tokens=60, endpoint=A)
    gate.on_dispatch(flow_request)
    flow_request.input_tokens = 90  # the usage corrected the estimate
    gate.on_complete(flow_request)
    assert gate.saturation() == 0.0


def test_a_lower_band_closes_first_under_a_holdback_policy() -> None:
    pool = pool_of(fresh())
    gate = DetectorGate(
        ConcurrencyDetector(max_concurrency=10), lambda: pool, lambda: NOW, PriorityHoldback(0.5)
    )
    for index in range(6):
        gate.on_dispatch(request(index, endpoint=A))
    assert gate.is_open(1) and not gate.is_open(-1)


def test_through_the_core_the_pool_takes_max_concurrency_per_endpoint() -> None:
    pool = pool_of(fresh(), fresh())
    config = FlowControlConfig()
    gate_config = detector_config(
        {"type": "concurrency-detector", "parameters": {"maxConcurrency": 3}}
    )
    gate, credits = build_gate(gate_config, lambda: pool, lambda: NOW)
    scheduler = Scheduler(SchedulingConfig(), lambda: pool, lambda: NOW, random.Random(1), credits)
    controller = FlowController(config, gate, scheduler)
    for index in range(10):
        payload = InferenceRequest("m", "m", prompt=f"{index:03d}" * 40)
        assert (
            controller.enqueue(FlowRequest(str(index), "t", 0, NOW, payload=payload), NOW) is None
        )
    dispatched = controller.dispatch(NOW)
    assert Counter(r.endpoint for r in dispatched) == {A: 3, B: 3}
    assert len(controller.complete(dispatched[0], NOW)) == 1  # the freed credit is taken at once


# -- max-saturation-detector ---------------------------------------------------


def role_pool(*roles_and_metrics: tuple[str | None, EndpointMetrics]) -> PoolSnapshot:
    endpoints = tuple(
        Endpoint(
            f"e{i}",
            f"10.0.0.{i}:8000",
            labels={} if role is None else {"llm-d.ai/role": role},
            metrics=metrics,
        )
        for i, (role, metrics) in enumerate(roles_and_metrics, 1)
    )
    return PoolSnapshot(endpoints, 1, 1)


EVERY_STAGE: frozenset[str] = frozenset()


def test_max_detector_reads_the_largest_of_its_children() -> None:
    queue = UtilizationDetector()
    concurrency = ConcurrencyDetector(max_concurrency=4)
    detector = MaxSaturationDetector((queue, concurrency), (EVERY_STAGE, EVERY_STAGE))
    pool = pool_of(fresh(waiting=1), fresh(waiting=1))  # queue: 0.2
    assert detector.saturation(pool, NOW, {A: (3, 0), B: (3, 0)})[0] == 0.75
    assert detector.saturation(pool, NOW, {})[0] == pytest.approx(0.2)


def test_max_detector_scopes_children_to_their_stage_in_a_split_pool() -> None:
    # decode gated by concurrency only, prefill by queue depth only
    concurrency = ConcurrencyDetector(max_concurrency=2)
    queue = UtilizationDetector()
    detector = MaxSaturationDetector(
        (concurrency, queue), (frozenset({"decode"}), frozenset({"prefill"}))
    )
    pool = role_pool(("decode", fresh(waiting=5)), ("prefill", fresh(waiting=1)))
    # The decode pod's full queue does not count: only concurrency reads decode.
    assert detector.saturation(pool, NOW, {A: (1, 0)})[0] == pytest.approx(0.5)
    assert detector.saturation(pool, NOW, {})[0] == pytest.approx(0.2)


def test_max_detector_stage_without_a_child_in_scope_reads_zero() -> None:
    detector = MaxSaturationDetector((UtilizationDetector(),), (frozenset({"prefill"}),))
    pool = role_pool(("decode", fresh(waiting=50)), ("prefill", fresh()))
    assert detector.saturation(pool, NOW, {})[0] == 0.0


def test_max_detector_reads_every_child_on_a_pool_not_split_by_stage() -> None:
    detector = MaxSaturationDetector((UtilizationDetector(),), (frozenset({"prefill"}),))
    assert detector.saturation(pool_of(fresh(waiting=5)), NOW, {})[0] == 1.0


def test_max_detector_admits_an_endpoint_only_when_every_child_in_scope_does() -> None:
    concurrency = ConcurrencyDetector(max_concurrency=2)
    queue = UtilizationDetector()
    detector = MaxSaturationDetector(
        (concurrency, queue), (frozenset({"decode"}), frozenset({"prefill"}))
    )
    decode, prefill = role_pool(
        ("decode", fresh(waiting=9)), ("prefill", fresh(waiting=9))
    ).endpoints
    assert detector.admits(decode, NOW, {})  # the queue child does not read decode
    assert not detector.admits(decode, NOW, {A: (2, 0)})
    assert not detector.admits(prefill, NOW, {})


def test_max_detector_falls_back_only_when_every_child_does() -> None:
    both = (EVERY_STAGE, EVERY_STAGE)
    assert MaxSaturationDetector((UtilizationDetector(), UtilizationDetector()), both).falls_back
    assert not MaxSaturationDetector(
        (UtilizationDetector(), ConcurrencyDetector()), both
    ).falls_back


# -- a detector listed in a scheduling profile -----------------------------------


def test_a_detector_in_a_profile_filters_by_what_this_epp_has_in_flight() -> None:
    load = InFlightLoad()
    load.on_dispatch(request(1, endpoint=A))
    pool = pool_of(fresh(), fresh())
    detector_filter = DetectorFilter(ConcurrencyDetector(max_concurrency=1), load, lambda: NOW)
    assert [e.address for e in detector_filter.filter(None, pool.endpoints)] == [B]


def test_a_utilization_detector_in_a_profile_keeps_everyone_when_no_endpoint_passes() -> None:
    pool = pool_of(fresh(waiting=9), fresh(waiting=9))
    detector_filter = DetectorFilter(UtilizationDetector(), InFlightLoad(), lambda: NOW)
    assert detector_filter.filter(None, pool.endpoints) == pool.endpoints


def test_a_detector_gate_tells_the_active_request_scorer_what_is_in_flight_per_endpoint() -> None:
    pool = pool_of(fresh(), fresh())
    gate = DetectorGate(ConcurrencyDetector(), lambda: pool, lambda: NOW)
    gate.on_dispatch(request(1, endpoint=A))
    assert (gate.in_flight_at(A), gate.in_flight_at(B)) == (1, 0)
