"""Flow-control plugin types: fairness, ordering, saturation detectors,
usage-limit policies and eviction, with the reference's parameter names,
types and defaults (`pkg/epp/framework/plugins/flowcontrol/`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.config.catalog import ALPHA, T
from epp.config.plugin import (
    Kind,
    Param,
    ParameterError,
    Parameters,
    PluginType,
    configured,
)
from epp.flowcontrol.config import BandConfig, ProgramAwareConfig
from epp.flowcontrol.eviction import PriorityThenTime, SheddableFilter
from epp.flowcontrol.usagelimits import (
    Domain,
    PriorityHoldback,
    SoftReflectiveCeiling,
    StaticUsageLimit,
)
from epp.scheduling.detectors import ConcurrencyDetector, ConcurrencyMode, UtilizationDetector
from epp.scheduling.saturation import DEFAULT_THRESHOLDS as SATURATION
from epp.scheduling.saturation import SaturationThresholds
from epp.scheduling.stages import DECODE, PREFILL

_BAND = BandConfig(0)
"""The core's band defaults, which the fairness policies' parameters read."""
_LAS = ProgramAwareConfig()


def _priority_holdback(parameters: Parameters) -> PriorityHoldback:
    low, high = parameters["minCeiling"], parameters["maxCeiling"]
    if low >= 1.0:
        raise ParameterError("minCeiling", f"must be in [0.0, 1.0), got {low}")
    if low >= high:
        raise ParameterError(
            "minCeiling", f"must be strictly less than maxCeiling ({high}), got {low}"
        )
    return PriorityHoldback(low, high, Domain(parameters["domain"]))


def _utilization_detector(parameters: Parameters) -> UtilizationDetector:
    kv = parameters["kvCacheUtilThreshold"]
    if kv > 1.0:
        raise ParameterError("kvCacheUtilThreshold", f"must be in (0.0, 1.0], got {kv}")
    thresholds = SaturationThresholds(
        parameters["queueDepthThreshold"], kv, parameters["metricsStalenessThreshold"]
    )
    ignore = parameters["stalenessPolicy"] == "ignore"
    return UtilizationDetector(thresholds, parameters["headroom"], ignore)


@dataclass(slots=True, frozen=True)
class MaxDetectorRefs:
    """A `max-saturation-detector` as declared: the names of its children,
    which the loader resolves to their detectors, and each one's stages
    (empty: every stage)."""

    detectors: tuple[str, ...]
    stages: Mapping[str, frozenset[str]]


DETECTOR_STAGES = (DECODE, PREFILL)


def _max_detector(parameters: Parameters) -> MaxDetectorRefs:
    detectors = parameters["detectors"]
    if not detectors:
        raise ParameterError("detectors", "needs at least one entry")
    for name in detectors:
        if detectors.count(name) > 1:
            raise ParameterError("detectors", f"duplicate entry: {name}")
    raw = parameters["stages"] or {}
    if not isinstance(raw, Mapping):
        raise ParameterError("stages", "must map a detector's name to a list of stages")
    stages: dict[str, frozenset[str]] = {}
    for name, listed in raw.items():
        where = f"stages.{name}"
        if name not in detectors:
            raise ParameterError(where, "is not listed in detectors")
        if not isinstance(listed, list) or not listed:
            raise ParameterError(where, "must name at least one stage")
        for stage in listed:
            if stage not in DETECTOR_STAGES:
                raise ParameterError(
                    where, f"unsupported stage {stage!r}; one of {', '.join(DETECTOR_STAGES)}"
                )
        stages[name] = frozenset(listed)
    return MaxDetectorRefs(tuple(detectors), stages)


def _concurrency_detector(parameters: Parameters) -> ConcurrencyDetector:
    return ConcurrencyDetector(
        ConcurrencyMode(parameters["concurrencyMode"]),
        parameters["maxConcurrency"],
        parameters["maxTokenConcurrency"],
        parameters["headroom"],
    )


ENTRIES: tuple[PluginType, ...] = (
    # -- fairness (between the flows of a band) --------------------------------
    PluginType(
        "global-strict-fairness-policy",
        Kind.FAIRNESS,
        "the best head request of the band goes first, whatever its flow",
        factory=configured,
    ),
    PluginType(
        "round-robin-fairness-policy",
        Kind.FAIRNESS,
        "flows take turns, one request each",
        factory=configured,
    ),
    PluginType(
        "vtc-fairness-policy",
        Kind.FAIRNESS,
        "epp's own: Virtual Token Counter, the least-served flow goes first "
        "(input + 2 x output tokens)",
        (
            Param("inputTokenWeight", T.FLOAT, _BAND.input_weight, "charge per input token", 0),
            Param("outputTokenWeight", T.FLOAT, _BAND.output_weight, "charge per output token", 0),
        ),
        factory=configured,
    ),
    PluginType(
        "program-aware-fairness",
        Kind.FAIRNESS,
        "least attained service first (LAS): input + 2 x output tokens, decaying with "
        "a half-life; the oldest head breaks ties",
        (
            Param("strategy", T.STRING, "las", "scoring strategy", choices=("las",)),
            Param(
                "lasWeightService",
                T.FLOAT,
                _LAS.weight_service,
                "weight of inverted attained service",
                0,
            ),
            Param(
                "lasWeightHeadWait",
                T.FLOAT,
                _LAS.weight_head_wait,
                "weight of head-of-queue age",
                0,
            ),
            Param(
                "lasHalfLifeSeconds",
                T.FLOAT,
                _LAS.half_life,
                "half-life of attained service; 0 = none",
                0,
            ),
            Param(
                "evictionTtlSeconds",
                T.FLOAT,
                _LAS.eviction_ttl,
                "programs idle this long are dropped",
                0,
            ),
            Param(
                "evictionSweepSeconds", T.FLOAT, _LAS.eviction_sweep, "sweep period", 0, None, True
            ),
        ),
        factory=configured,
    ),
    # -- ordering (inside a flow) ---------------------------------------------
    PluginType(
        "fcfs-ordering-policy",
        Kind.ORDERING,
        "first come, first served",
        factory=configured,
    ),
    PluginType(
        "edf-ordering-policy",
        Kind.ORDERING,
        "earliest deadline (arrival + TTL) first",
        factory=configured,
    ),
    PluginType(
        "slo-deadline-ordering-policy",
        Kind.ORDERING,
        "earliest TTFT deadline (arrival + x-llm-d-slo-ttft-ms) first",
        factory=configured,
    ),
    # -- saturation detectors -------------------------------------------------
    PluginType(
        "utilization-detector",
        Kind.SATURATION_DETECTOR,
        "pool saturation = mean over pods of max(queue / threshold, KV / threshold); "
        "stale or missing metrics count as saturated",
        (
            Param(
                "queueDepthThreshold",
                T.INT,
                SATURATION.queue_depth,
                "waiting requests per pod",
                0,
                None,
                True,
            ),
            Param(
                "kvCacheUtilThreshold",
                T.FLOAT,
                SATURATION.kv_cache,
                "KV-cache usage per pod (<= 1)",
                0,
                None,
                True,
            ),
            Param(
                "metricsStalenessThreshold",
                T.DURATION,
                SATURATION.staleness,
                "older metrics are stale",
                0,
                None,
                True,
            ),
            Param("headroom", T.FLOAT, 0.0, "burst allowance above the thresholds", 0),
            Param(
                "stalenessPolicy",
                T.STRING,
                "saturated",
                "stale or missing metrics count 1.0 (saturated) or are left out of the "
                "pool's mean (ignore: an all-stale pool reads 0); llm-d-router PR #2492",
                choices=("saturated", "ignore"),
            ),
        ),
        factory=_utilization_detector,
    ),
    PluginType(
        "concurrency-detector",
        Kind.SATURATION_DETECTOR,
        "pool saturation from the EPP's own in-flight requests or tokens per pod",
        (
            Param(
                "concurrencyMode",
                T.STRING,
                "requests",
                "what is counted",
                choices=("requests", "tokens", "hybrid"),
            ),
            Param("maxConcurrency", T.INT, 100, "requests in flight per pod", 0, None, True),
            Param(
                "maxTokenConcurrency", T.INT, 1_000_000, "tokens in flight per pod", 0, None, True
            ),
            Param("headroom", T.FLOAT, 0.0, "burst allowance above the limits", 0),
            Param("inFlightLoadProducerName", T.STRING, ""),
        ),
        factory=_concurrency_detector,
    ),
    PluginType(
        "max-saturation-detector",
        Kind.SATURATION_DETECTOR,
        "pool saturation = the largest of the named detectors' readings, each child "
        "scoped to the stages `stages` lists (per stage when the pool has prefill pods)",
        (
            Param("detectors", T.STRINGS, (), "the child detectors' names", required=True),
            Param("stages", T.ANY, None, "child name -> [prefill, decode]; default every stage"),
        ),
        factory=_max_detector,
        source="llm-d-router PR #2827, stages PR #2926",
    ),
    # -- band selection (which band is offered a dispatch first) -----------------
    PluginType(
        "strict-band-selection-policy",
        Kind.BAND_SELECTION,
        "bands are offered a dispatch from the highest priority down (the default)",
        factory=configured,
        source="llm-d-router PR #2920 (pkg/epp/framework/plugins/flowcontrol/bandselection)",
    ),
    # -- usage limits (a ceiling on saturation per priority) --------------------
    PluginType(
        "static-usage-limit-policy",
        Kind.USAGE_LIMIT,
        "one ceiling for every priority",
        (Param("threshold", T.FLOAT, 1.0, "the ceiling; 1.0 = no gating", 0, 1, True),),
        factory=lambda parameters: StaticUsageLimit(parameters["threshold"]),
    ),
    PluginType(
        "priority-holdback-policy",
        Kind.USAGE_LIMIT,
        "ceilings from minCeiling (lowest priority) to maxCeiling (highest)",
        (
            Param("shape", T.STRING, "linear", "interpolation curve", choices=("linear",)),
            Param("domain", T.STRING, "rank", "priority mapping", choices=("rank", "value")),
            Param("minCeiling", T.FLOAT, None, "ceiling of the lowest priority", 0, required=True),
            Param("maxCeiling", T.FLOAT, 1.0, "ceiling of the highest priority", 0, 1, True),
        ),
        factory=_priority_holdback,
        stability=ALPHA,
    ),
    PluginType(
        "soft-reflective-ceiling-policy",
        Kind.USAGE_LIMIT,
        "lower bands alternate open and closed in proportion to saturation",
        factory=lambda parameters: SoftReflectiveCeiling(),
        stability=ALPHA,
    ),
    # -- eviction -------------------------------------------------------------
    PluginType(
        "sheddable-eviction-filter",
        Kind.EVICTION_FILTER,
        "only sheddable (negative-priority) in-flight requests may be evicted",
        factory=lambda parameters: SheddableFilter(),
        stability=ALPHA,
    ),
    PluginType(
        "priority-then-time-eviction-order-policy",
        Kind.EVICTION_ORDERING,
        "evicts the lowest priority first, the newest first within it",
        factory=lambda parameters: PriorityThenTime(),
        stability=ALPHA,
    ),
)
