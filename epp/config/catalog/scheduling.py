"""Scheduling plugin types: filters, scorers and pickers, with the
reference's parameter names, types and defaults (each plugin's README
under `pkg/epp/framework/plugins/scheduling/`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.config.catalog import ALPHA, T, made
from epp.config.catalog.sessions import SESSION_PARAMETERS, session_factory
from epp.config.plugin import (
    MULTICLUSTER_UNSUPPORTED,
    NEEDS_LATENCY_PREDICTOR,
    Kind,
    Param,
    ParameterError,
    PluginType,
    Unsupported,
    configured,
)
from epp.scheduling import cache_scorers, filters, pickers, scorers, sessions
from epp.scheduling.saturation import DEFAULT_THRESHOLDS as SATURATION
from epp.scheduling.spec import PluginSpec

PART3 = "issue #14, scheduling plugins"

_TOPOLOGY = "needs node topology attributes (topology-extractor), which epp does not collect"
_ENDPOINT_ATTRIBUTE = "needs endpoint attributes from plugins epp does not run"
_MM_CACHE = "needs multimodal embedding hashes (mm-embeddings-cache-producer)"
_PRECISE_SCORER_REMOVED = (
    "removed by the reference (llm-d-router PR #2844): use precise-prefix-cache-producer "
    "with prefix-cache-scorer and its prefixMatchInfoProducerName"
)


def _selector(parameters: Mapping[str, Any]) -> PluginSpec:
    expressions = []
    for index, requirement in enumerate(parameters["matchExpressions"]):
        operator, values = requirement["operator"], requirement["values"]
        if operator in ("In", "NotIn") and not values:
            raise ParameterError(f"matchExpressions[{index}].values", f"{operator} needs values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ParameterError(f"matchExpressions[{index}].values", f"{operator} takes none")
        expressions.append((requirement["key"], operator, frozenset(values)))
    return made(
        filters.label_selector_filter,
        match_labels=tuple(sorted((parameters["matchLabels"] or {}).items())),
        expressions=tuple(expressions),
    )


def _by_label(parameters: Mapping[str, Any]) -> PluginSpec:
    if not parameters["validValues"] and not parameters["allowsNoLabel"]:
        raise ParameterError("validValues", "required unless allowsNoLabel is true")
    return made(
        filters.by_label_filter,
        label=parameters["label"],
        valid_values=frozenset(parameters["validValues"]),
        allows_no_label=parameters["allowsNoLabel"],
    )


def _picker(make: Any) -> Any:
    def factory(parameters: Mapping[str, Any]) -> PluginSpec:
        count = parameters["maxNumOfEndpoints"]
        return made(make) if count == 1 else made(make, count=count)

    return factory


def _prefix_scorer(parameters: Mapping[str, Any]) -> PluginSpec:
    weight = parameters["matchLengthWeight"]
    scale = parameters["matchLengthScaleTokens"]
    if weight > 0 and scale <= 0:
        raise ParameterError("matchLengthScaleTokens", "must be > 0 when matchLengthWeight > 0")
    producer = parameters["prefixMatchInfoProducerName"]
    if producer:
        return made(
            cache_scorers.prefix_cache_scorer,
            match_length_weight=weight,
            match_length_scale_tokens=scale,
            producer=producer,
        )
    return made(
        cache_scorers.prefix_cache_scorer,
        match_length_weight=weight,
        match_length_scale_tokens=scale,
    )


def _utilization(parameters: Mapping[str, Any]) -> PluginSpec:
    conditions = parameters["conditions"]
    if not conditions:
        raise ParameterError("conditions", "at least one condition is required")
    for index, condition in enumerate(conditions):
        if condition["metric"] == "kv-cache-utilization" and condition["maxValue"] > 1:
            raise ParameterError(
                f"conditions[{index}].maxValue", "kv-cache-utilization is a fraction: at most 1"
            )
    return made(
        filters.utilization_filter,
        conditions=tuple((c["metric"], float(c["maxValue"])) for c in conditions),
        fallback_on_empty=parameters["fallbackOnEmpty"],
    )


def _prefix_affinity(parameters: Mapping[str, Any]) -> PluginSpec:
    penalty = parameters["maxTTFTPenaltyMs"]
    if penalty > 0 and parameters["ttftSource"] == "latencyPredictor":
        raise Unsupported(
            "prefix-cache-affinity-filter",
            f"ttftSource latencyPredictor {NEEDS_LATENCY_PREDICTOR}; "
            "prefillThroughput (the default) estimates TTFT from the tokens in flight",
        )
    if penalty > 0 and parameters["peakPrefillThroughput"] <= 0:
        raise ParameterError("peakPrefillThroughput", "must be > 0 when maxTTFTPenaltyMs > 0")
    return made(
        filters.prefix_cache_affinity_filter,
        threshold=parameters["affinityThreshold"],
        exploration=parameters["explorationProbability"],
        max_ttft_penalty_ms=penalty,
        peak_prefill_throughput=parameters["peakPrefillThroughput"],
    )


def _header_label(parameters: Mapping[str, Any]) -> PluginSpec:
    for field in ("headerName", "labelKey"):
        if not parameters[field]:
            raise ParameterError(field, "required")
    return made(
        scorers.header_label_affinity_scorer,
        header=parameters["headerName"].lower(),
        label_key=parameters["labelKey"],
    )


_LOAD_AWARE_THRESHOLD = 128
_TOKEN_LOAD_THRESHOLD = 4_194_304
"""Their scorers' defaults, which a value <= 0 also means."""

_PICKER_PARAMETERS = (
    Param("maxNumOfEndpoints", T.INT, 1, "endpoints returned (first used, rest for retries)", 1),
)

_LABEL_SELECTOR = (
    Param("matchLabels", T.STRING_MAP, None, "all pairs must match"),
    Param(
        "matchExpressions",
        T.LIST,
        (),
        "label selector requirements (In, NotIn, Exists, DoesNotExist)",
        fields=(
            Param("key", T.STRING, required=True),
            Param(
                "operator",
                T.STRING,
                required=True,
                choices=("In", "NotIn", "Exists", "DoesNotExist"),
            ),
            Param("values", T.STRINGS, ()),
        ),
    ),
)

ENTRIES: tuple[PluginType, ...] = (
    # -- filters --------------------------------------------------------------
    PluginType(
        "decode-filter",
        Kind.FILTER,
        "keeps decode-capable pods (llm-d.ai/role decode, prefill-decode, "
        "encode-prefill-decode, both) and unlabelled pods",
        factory=lambda p: made(filters.decode_filter),
    ),
    PluginType(
        "prefill-filter",
        Kind.FILTER,
        "keeps pods whose llm-d.ai/role can prefill (prefill, encode-prefill, ...)",
        factory=lambda p: made(filters.prefill_filter),
    ),
    PluginType(
        "encode-filter",
        Kind.FILTER,
        "keeps pods whose llm-d.ai/role can encode (encode, encode-prefill, ...)",
        factory=lambda p: made(filters.encode_filter),
    ),
    PluginType(
        "label-selector-filter",
        Kind.FILTER,
        "keeps pods whose labels match a Kubernetes label selector",
        _LABEL_SELECTOR,
        factory=_selector,
    ),
    PluginType(
        "by-label-selector",
        Kind.FILTER,
        "deprecated name of label-selector-filter",
        _LABEL_SELECTOR,
        factory=_selector,
        deprecated_for="label-selector-filter",
    ),
    PluginType(
        "by-label",
        Kind.FILTER,
        "deprecated: keeps pods whose label has one of the valid values",
        (
            Param("label", T.STRING, required=True),
            Param("validValues", T.STRINGS, ()),
            Param("allowsNoLabel", T.BOOL, False),
        ),
        factory=_by_label,
        deprecated_for="label-selector-filter",
    ),
    PluginType(
        "prefix-cache-affinity-filter",
        Kind.FILTER,
        "keeps pods with a prefix-cache score above the threshold unless the load "
        "penalty breaks stickiness",
        (
            Param(
                "affinityThreshold",
                T.FLOAT,
                0.80,
                "share of the prompt's blocks cached for stickiness; <= 0 turns the filter off",
                maximum=1,
            ),
            Param("explorationProbability", T.FLOAT, 0.0, "chance to skip the gate", 0, 1),
            Param(
                "maxTTFTPenaltyMs",
                T.FLOAT,
                18000.0,
                "TTFT penalty that breaks stickiness; 0 = always stick",
                0,
            ),
            Param(
                "ttftSource",
                T.STRING,
                "prefillThroughput",
                "how the TTFT penalty is estimated",
                choices=("prefillThroughput", "latencyPredictor"),
            ),
            Param("peakPrefillThroughput", T.FLOAT, 15928.0, "tokens per second", 0),
            Param("inFlightLoadProducerName", T.STRING, ""),
            Param("latencyPredictionInfoProducerName", T.STRING, ""),
            Param("prefixMatchInfoProducerName", T.STRING, ""),
        ),
        factory=_prefix_affinity,
    ),
    PluginType(
        "saturation-filter",
        Kind.FILTER,
        "epp's own: drops pods with stale metrics or a queue or KV cache over the "
        "thresholds, unless that drops them all; the utilization gate and the "
        "pool-saturation gauge read the same thresholds",
        (
            Param(
                "metricsStalenessThreshold",
                T.DURATION,
                SATURATION.staleness,
                "older metrics count as stale",
                0,
            ),
            Param(
                "queueDepthThreshold",
                T.FLOAT,
                SATURATION.queue_depth,
                "waiting requests per pod",
                0,
                None,
                True,
            ),
            Param(
                "kvCacheUtilThreshold", T.FLOAT, SATURATION.kv_cache, "KV-cache usage per pod", 0, 1
            ),
        ),
        factory=configured,
    ),
    PluginType(
        "session-affinity-filter",
        Kind.FILTER,
        "keeps only the pod a session is pinned to (all when it is not a candidate); "
        "sets x-session-token on the response",
        SESSION_PARAMETERS,
        factory=session_factory(sessions.SessionAffinityFilter),
        stability=ALPHA,
    ),
    PluginType(
        "utilization-filter",
        Kind.FILTER,
        "keeps pods whose every metric (active-requests, running-requests, waiting-queue, "
        "kv-cache-utilization) is at most its cap",
        (
            Param(
                "conditions",
                T.LIST,
                (),
                "metric caps, all must hold",
                required=True,
                fields=(
                    Param(
                        "metric",
                        T.STRING,
                        required=True,
                        choices=(
                            "active-requests",
                            "running-requests",
                            "waiting-queue",
                            "kv-cache-utilization",
                        ),
                    ),
                    Param("maxValue", T.FLOAT, required=True, minimum=0),
                ),
            ),
            Param("fallbackOnEmpty", T.BOOL, False, "keep all when every pod is dropped"),
            Param("inFlightLoadProducerName", T.STRING, ""),
        ),
        factory=_utilization,
        stability=ALPHA,
    ),
    PluginType(
        "endpoint-attribute-filter",
        Kind.FILTER,
        "filters pods on endpoint attributes",
        refusal=_ENDPOINT_ATTRIBUTE,
        stability=ALPHA,
    ),
    PluginType(
        "topology-affinity-filter",
        Kind.FILTER,
        "keeps pods in the same topology domain",
        refusal=_TOPOLOGY,
        stability=ALPHA,
    ),
    PluginType(
        "slo-headroom-tier-filter",
        Kind.FILTER,
        "tiers pods by predicted SLO headroom",
        refusal=NEEDS_LATENCY_PREDICTOR,
    ),
    PluginType(
        "multicluster-session-affinity-filter",
        Kind.FILTER,
        "session affinity across clusters",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    PluginType(
        "header-based-testing-filter",
        Kind.FILTER,
        "the reference's test filter (pods named in a header)",
        refusal="a test-only plugin of the reference",
    ),
    # -- scorers --------------------------------------------------------------
    PluginType(
        "queue-scorer",
        Kind.SCORER,
        "shorter waiting queue scores higher (min-max over the candidates)",
        factory=lambda p: made(scorers.queue_scorer),
    ),
    PluginType(
        "kv-cache-utilization-scorer",
        Kind.SCORER,
        "more free KV cache scores higher: 1 - usage",
        factory=lambda p: made(scorers.kv_cache_scorer),
    ),
    PluginType(
        "prefix-cache-scorer",
        Kind.SCORER,
        "longer cached prompt prefix scores higher: matched / total blocks",
        (
            Param("matchLengthWeight", T.FLOAT, 0.0, "weight of the absolute match length", 0, 1),
            Param("matchLengthScaleTokens", T.INT, 8192, "tokens that normalise the match length"),
            Param("prefixMatchInfoProducerName", T.STRING, ""),
        ),
        factory=_prefix_scorer,
    ),
    PluginType(
        "lora-affinity-scorer",
        Kind.SCORER,
        "adapter active 1.0, free slot 0.8, adapter waiting 0.6, else 0",
        factory=lambda p: made(scorers.lora_affinity_scorer),
    ),
    PluginType(
        "running-requests-size-scorer",
        Kind.SCORER,
        "fewer running requests scores higher (min-max over the candidates)",
        factory=lambda p: made(scorers.running_requests_scorer),
    ),
    PluginType(
        "load-aware-scorer",
        Kind.SCORER,
        "empty queue 0.5, else 0.5 - 0.5 x queue / threshold (down to 0)",
        (
            Param(
                "threshold",
                T.INT,
                _LOAD_AWARE_THRESHOLD,
                "queue depth at which the score reaches 0",
            ),
        ),
        factory=lambda p: made(
            scorers.load_aware_scorer,
            threshold=p["threshold"] if p["threshold"] > 0 else _LOAD_AWARE_THRESHOLD,
        ),
    ),
    PluginType(
        "active-request-scorer",
        Kind.SCORER,
        "fewer requests in flight from this EPP scores higher",
        (
            Param("idleThreshold", T.INT, 0, "in-flight count at or below which a pod scores 1", 0),
            Param("maxBusyScore", T.FLOAT, 1.0, "highest score of a busy pod", 0, 1),
            Param("requestTimeout", T.STRING, "", "deprecated and ignored"),
            Param("inFlightLoadProducerName", T.STRING, ""),
        ),
        factory=lambda p: made(
            scorers.active_request_scorer,
            idle_threshold=p["idleThreshold"],
            max_busy_score=p["maxBusyScore"],
        ),
    ),
    PluginType(
        "token-load-scorer",
        Kind.SCORER,
        "fewer prompt tokens in flight (plus the request's uncached prompt) scores higher: "
        "1 - tokens / queueThresholdTokens",
        (
            Param(
                "queueThresholdTokens",
                T.INT,
                _TOKEN_LOAD_THRESHOLD,
                "in-flight tokens that score 0; <= 0 means the default",
            ),
            Param("inFlightLoadProducerName", T.STRING, ""),
        ),
        factory=lambda p: made(
            cache_scorers.token_load_scorer,
            threshold=p["queueThresholdTokens"]
            if p["queueThresholdTokens"] > 0
            else _TOKEN_LOAD_THRESHOLD,
        ),
    ),
    PluginType(
        "no-hit-lru-scorer",
        Kind.SCORER,
        "on a cache miss, prefers the pods least recently sent a miss",
        (
            Param("prefixPluginType", T.STRING, "prefix-cache-scorer"),
            Param("prefixPluginName", T.STRING, "prefix-cache-scorer"),
            Param("prefixMatchInfoProducerName", T.STRING, ""),
            Param("lruSize", T.INT, 1024, "pods tracked", 1),
        ),
        factory=lambda p: made(cache_scorers.no_hit_lru_scorer, size=p["lruSize"]),
    ),
    PluginType(
        "session-affinity-scorer",
        Kind.SCORER,
        "scores the pod a session is pinned to 1, others 0; sets x-session-token on the response",
        SESSION_PARAMETERS,
        factory=session_factory(sessions.SessionAffinityScorer),
        stability=ALPHA,
    ),
    PluginType(
        "context-length-aware",
        Kind.SCORER,
        "prefers pods whose llm-d.ai/context-length-range fits the prompt",
        (
            Param("label", T.STRING, "llm-d.ai/context-length-range", "pod label with min-max"),
            Param("enableFiltering", T.BOOL, False, "also drop out-of-range pods"),
        ),
        factory=lambda p: made(
            scorers.context_length_scorer, label=p["label"], filtering=p["enableFiltering"]
        ),
    ),
    PluginType(
        "header-label-affinity-scorer",
        Kind.SCORER,
        "pods whose label equals a request header score 1, others 0",
        (
            Param("headerName", T.STRING, required=True),
            Param("labelKey", T.STRING, required=True),
        ),
        factory=_header_label,
        stability=ALPHA,
    ),
    PluginType(
        "precise-prefix-cache-scorer",
        Kind.SCORER,
        "prefix affinity from vLLM KV-cache events",
        refusal=_PRECISE_SCORER_REMOVED,
    ),
    PluginType(
        "mm-embeddings-cache-scorer",
        Kind.SCORER,
        "multimodal encoder-cache affinity",
        refusal=_MM_CACHE,
    ),
    PluginType(
        "latency-scorer",
        Kind.SCORER,
        "scores pods by predicted latency",
        refusal=NEEDS_LATENCY_PREDICTOR,
    ),
    PluginType(
        "endpoint-attribute-scorer",
        Kind.SCORER,
        "scores pods on endpoint attributes",
        refusal=_ENDPOINT_ATTRIBUTE,
        stability=ALPHA,
    ),
    PluginType(
        "topology-affinity-scorer",
        Kind.SCORER,
        "prefers pods in the same topology domain",
        refusal=_TOPOLOGY,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-queue-scorer",
        Kind.SCORER,
        "queue scorer over clusters",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-kv-cache-utilization-scorer",
        Kind.SCORER,
        "KV-cache scorer over clusters",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-prefix-cache-scorer",
        Kind.SCORER,
        "prefix scorer over clusters",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    # -- pickers --------------------------------------------------------------
    PluginType(
        "max-score-picker",
        Kind.PICKER,
        "highest total score, ties broken at random",
        _PICKER_PARAMETERS,
        factory=_picker(pickers.max_score_picker),
    ),
    PluginType(
        "random-picker",
        Kind.PICKER,
        "uniformly at random, ignoring scores",
        _PICKER_PARAMETERS,
        factory=_picker(pickers.random_picker),
    ),
    PluginType(
        "weighted-random-picker",
        Kind.PICKER,
        "chance proportional to total score (A-Res sampling)",
        _PICKER_PARAMETERS,
        factory=_picker(pickers.weighted_random_picker),
    ),
)
