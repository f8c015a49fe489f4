"""Scheduling plugin types: filters, scorers, pickers, profile handlers and
deciders, with the reference's parameter names, types and defaults (each
plugin's README under `pkg/epp/framework/plugins/scheduling/`)."""

from __future__ import annotations

from epp.config.plugin import Kind, Param, ParamType, PluginType, Stability, configured, pending

T = ParamType
ALPHA = Stability.ALPHA
PART3 = "issue #14, scheduling plugins"

_NEEDS_LATENCY_PREDICTOR = (
    "needs the reference's latency-predictor sidecar (trained XGBoost models), "
    "which epp does not run"
)
_MULTICLUSTER = "cluster-scoped (multi-cluster) EPPs are not supported"
_TOPOLOGY = "needs node topology attributes (topology-extractor), which epp does not collect"
_ENDPOINT_ATTRIBUTE = "needs endpoint attributes from plugins epp does not run"
_MM_CACHE = "needs multimodal embedding hashes (mm-embeddings-cache-producer)"
_PRECISE = (
    "needs vLLM KV-cache events over ZMQ and a real tokenizer (precise prefix cache); "
    "planned in a later issue"
)

_SESSION_PARAMETERS = (
    Param(
        "strategy",
        T.STRING,
        "encoded_endpoint_header",
        "how the session is carried",
        choices=("encoded_endpoint_header", "session_id"),
    ),
    Param("profileName", T.STRING, "", "the profile whose result this instance pins"),
    Param(
        "encodedEndpointHeaderConfig",
        T.OBJECT,
        fields=(Param("header", T.STRING, "x-session-token", "header with the pod token"),),
    ),
    Param(
        "sessionIdConfig",
        T.OBJECT,
        fields=(
            Param(
                "sources",
                T.LIST,
                ({"header": "x-session-id", "attribute": "", "producer": ""},),
                "where the session id is read, first non-empty wins",
                fields=(
                    Param("header", T.STRING, ""),
                    Param("attribute", T.STRING, ""),
                    Param("producer", T.STRING, ""),
                ),
            ),
            Param("evictionTtlSeconds", T.FLOAT, 300.0, "unused bindings live this long"),
            Param("evictionSweepSeconds", T.FLOAT, 10.0, "how often bindings are swept"),
        ),
    ),
)

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
        factory=pending("decode-filter", PART3),
    ),
    PluginType(
        "prefill-filter",
        Kind.FILTER,
        "keeps pods whose llm-d.ai/role can prefill (prefill, encode-prefill, ...)",
        factory=pending("prefill-filter", PART3),
    ),
    PluginType(
        "encode-filter",
        Kind.FILTER,
        "keeps pods whose llm-d.ai/role can encode (encode, encode-prefill, ...)",
        factory=pending("encode-filter", PART3),
    ),
    PluginType(
        "label-selector-filter",
        Kind.FILTER,
        "keeps pods whose labels match a Kubernetes label selector",
        _LABEL_SELECTOR,
        factory=pending("label-selector-filter", PART3),
    ),
    PluginType(
        "by-label-selector",
        Kind.FILTER,
        "deprecated name of label-selector-filter",
        _LABEL_SELECTOR,
        factory=pending("by-label-selector", PART3),
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
        factory=pending("by-label", PART3),
        deprecated_for="label-selector-filter",
    ),
    PluginType(
        "prefix-cache-affinity-filter",
        Kind.FILTER,
        "keeps pods with a prefix-cache score above the threshold unless the load "
        "penalty breaks stickiness",
        (
            Param("affinityThreshold", T.FLOAT, 0.80, "prefix score for stickiness", 0, 1),
            Param("explorationProbability", T.FLOAT, 0.0, "chance to skip the gate", 0, 1),
            Param("maxTTFTPenaltyMs", T.FLOAT, 18000.0, "TTFT penalty that breaks stickiness", 0),
            Param(
                "ttftSource",
                T.STRING,
                "prefillThroughput",
                "how the TTFT penalty is estimated",
                choices=("prefillThroughput", "latencyPredictor"),
            ),
            Param("peakPrefillThroughput", T.FLOAT, 15928.0, "tokens per second", 0, None, True),
            Param("inFlightLoadProducerName", T.STRING, ""),
            Param("latencyPredictionInfoProducerName", T.STRING, ""),
            Param("prefixMatchInfoProducerName", T.STRING, ""),
        ),
        factory=pending("prefix-cache-affinity-filter", PART3),
    ),
    PluginType(
        "saturation-filter",
        Kind.FILTER,
        "epp's own: drops pods with stale metrics or a queue or KV cache over the "
        "thresholds, unless that drops them all",
        (
            Param("metricsStalenessThreshold", T.DURATION, 0.2, "older metrics count as stale", 0),
            Param("queueDepthThreshold", T.FLOAT, 5.0, "waiting requests per pod", 0),
            Param("kvCacheUtilThreshold", T.FLOAT, 0.8, "KV-cache usage per pod", 0, 1),
        ),
        factory=configured("saturation-filter"),
    ),
    PluginType(
        "session-affinity-filter",
        Kind.FILTER,
        "keeps only the pod a session is pinned to",
        _SESSION_PARAMETERS,
        factory=pending("session-affinity-filter", PART3),
        stability=ALPHA,
    ),
    PluginType(
        "utilization-filter",
        Kind.FILTER,
        "keeps pods whose metrics are under every configured cap",
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
        factory=pending("utilization-filter", PART3),
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
        refusal=_NEEDS_LATENCY_PREDICTOR,
    ),
    PluginType(
        "multicluster-session-affinity-filter",
        Kind.FILTER,
        "session affinity across clusters",
        refusal=_MULTICLUSTER,
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
        factory=configured("queue-scorer"),
    ),
    PluginType(
        "kv-cache-utilization-scorer",
        Kind.SCORER,
        "more free KV cache scores higher: 1 - usage",
        factory=configured("kv-cache-utilization-scorer"),
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
        factory=configured("prefix-cache-scorer"),
    ),
    PluginType(
        "lora-affinity-scorer",
        Kind.SCORER,
        "adapter active 1.0, free slot 0.8, adapter waiting 0.6, else 0",
        factory=configured("lora-affinity-scorer"),
    ),
    PluginType(
        "running-requests-size-scorer",
        Kind.SCORER,
        "fewer running requests scores higher (min-max over the candidates)",
        factory=configured("running-requests-size-scorer"),
    ),
    PluginType(
        "load-aware-scorer",
        Kind.SCORER,
        "empty queue 0.5, else 0.5 - 0.5 x queue / threshold (down to 0)",
        (Param("threshold", T.INT, 128, "queue depth at which the score reaches 0"),),
        factory=pending("load-aware-scorer", PART3),
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
        factory=pending("active-request-scorer", PART3),
    ),
    PluginType(
        "token-load-scorer",
        Kind.SCORER,
        "fewer tokens in flight scores higher: 1 - tokens / queueThresholdTokens",
        (
            Param("queueThresholdTokens", T.INT, 4_194_304, "in-flight tokens that score 0", 1),
            Param("inFlightLoadProducerName", T.STRING, ""),
        ),
        factory=pending("token-load-scorer", PART3),
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
        factory=pending("no-hit-lru-scorer", PART3),
    ),
    PluginType(
        "session-affinity-scorer",
        Kind.SCORER,
        "scores the pod a session is pinned to 1, others 0",
        _SESSION_PARAMETERS,
        factory=pending("session-affinity-scorer", PART3),
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
        factory=pending("context-length-aware", PART3),
    ),
    PluginType(
        "header-label-affinity-scorer",
        Kind.SCORER,
        "prefers pods whose label equals a request header",
        (
            Param("headerName", T.STRING, required=True),
            Param("labelKey", T.STRING, required=True),
        ),
        factory=pending("header-label-affinity-scorer", PART3),
        stability=ALPHA,
    ),
    PluginType(
        "precise-prefix-cache-scorer",
        Kind.SCORER,
        "prefix affinity from vLLM KV-cache events",
        refusal=_PRECISE,
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
        refusal=_NEEDS_LATENCY_PREDICTOR,
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
        refusal=_MULTICLUSTER,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-kv-cache-utilization-scorer",
        Kind.SCORER,
        "KV-cache scorer over clusters",
        refusal=_MULTICLUSTER,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-prefix-cache-scorer",
        Kind.SCORER,
        "prefix scorer over clusters",
        refusal=_MULTICLUSTER,
        stability=ALPHA,
    ),
    # -- pickers --------------------------------------------------------------
    PluginType(
        "max-score-picker",
        Kind.PICKER,
        "highest total score, ties broken at random",
        _PICKER_PARAMETERS,
        factory=configured("max-score-picker"),
    ),
    PluginType(
        "random-picker",
        Kind.PICKER,
        "uniformly at random, ignoring scores",
        _PICKER_PARAMETERS,
        factory=configured("random-picker"),
    ),
    PluginType(
        "weighted-random-picker",
        Kind.PICKER,
        "chance proportional to total score (A-Res sampling)",
        _PICKER_PARAMETERS,
        factory=configured("weighted-random-picker"),
    ),
    # -- profile handlers and deciders ----------------------------------------
    PluginType(
        "single-profile-handler",
        Kind.PROFILE_HANDLER,
        "runs the one scheduling profile",
        factory=configured("single-profile-handler"),
    ),
    PluginType(
        "disagg-profile-handler",
        Kind.PROFILE_HANDLER,
        "decode profile first, then prefill and encode when their deciders say so",
        (
            Param(
                "profiles",
                T.OBJECT,
                fields=(
                    Param("decode", T.STRING, "decode"),
                    Param("prefill", T.STRING, "prefill"),
                    Param("encode", T.STRING, "encode"),
                ),
            ),
            Param(
                "deciders",
                T.OBJECT,
                fields=(Param("prefill", T.STRING, ""), Param("encode", T.STRING, "")),
            ),
            Param("stageOrder", T.STRING, ""),
        ),
        factory=pending("disagg-profile-handler", PART3),
    ),
    PluginType(
        "pd-profile-handler",
        Kind.PROFILE_HANDLER,
        "deprecated P/D handler (decode then prefill by a prefix threshold)",
        (
            Param("decodeProfile", T.STRING, "decode"),
            Param("prefillProfile", T.STRING, "prefill"),
            Param("prefixPluginType", T.STRING, "prefix-cache-scorer"),
            Param("prefixPluginName", T.STRING, "prefix-cache-scorer"),
            Param("deciderPluginName", T.STRING, ""),
            Param("primaryPort", T.INT, 0),
        ),
        factory=pending("pd-profile-handler", PART3),
        deprecated_for="disagg-profile-handler",
    ),
    PluginType(
        "data-parallel-profile-handler",
        Kind.PROFILE_HANDLER,
        "one profile; the chosen rank's port becomes the pod's primary port",
        (Param("primaryPort", T.INT, 8000, "the pod's primary service port", 1, 65535),),
        factory=pending("data-parallel-profile-handler", PART3),
    ),
    PluginType(
        "header-profile-handler",
        Kind.PROFILE_HANDLER,
        "runs the profile a request header names",
        (
            Param("headerName", T.STRING, "EPP-Profile"),
            Param("defaultProfile", T.STRING, "decode"),
        ),
        factory=pending("header-profile-handler", PART3),
        stability=ALPHA,
    ),
    PluginType(
        "always-disagg-pd-decider",
        Kind.DECIDER,
        "always runs the prefill stage",
        factory=pending("always-disagg-pd-decider", PART3),
    ),
    PluginType(
        "prefix-based-pd-decider",
        Kind.DECIDER,
        "runs prefill when the uncached prompt tokens reach nonCachedTokens",
        (
            Param(
                "nonCachedTokens", T.INT, 0, "uncached tokens that trigger prefill; 0 = never", 0
            ),
            Param("promptTokens", T.INT, 0, "shortest prompt that may disaggregate", 0),
        ),
        factory=pending("prefix-based-pd-decider", PART3),
    ),
    PluginType(
        "always-disagg-multimodal-decider",
        Kind.DECIDER,
        "runs the encode stage for every request with multimodal content",
        factory=pending("always-disagg-multimodal-decider", PART3),
    ),
    PluginType(
        "disagg-headers-handler",
        Kind.REQUEST_CONTROL,
        "deprecated: writes x-prefiller-host-port (the disagg handler does it now)",
        (Param("prefillProfile", T.STRING, "prefill"), Param("encodeProfile", T.STRING, "encode")),
        factory=pending("disagg-headers-handler", PART3),
        deprecated_for="disagg-profile-handler",
    ),
    PluginType(
        "prefill-header-handler",
        Kind.REQUEST_CONTROL,
        "deprecated: writes x-prefiller-host-port",
        (Param("prefillProfile", T.STRING, "prefill"), Param("encodeProfile", T.STRING, "encode")),
        factory=pending("prefill-header-handler", PART3),
        deprecated_for="disagg-profile-handler",
    ),
)
