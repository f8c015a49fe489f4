"""Request plugin types: parsers, data producers, admitters and the other
request-control plugins, with the reference's parameter names, types and
defaults (`pkg/epp/framework/plugins/requesthandling/` and `requestcontrol/`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from epp.config.catalog import ALPHA, T
from epp.config.plugin import (
    MULTICLUSTER_UNSUPPORTED,
    NEEDS_LATENCY_PREDICTOR,
    Configured,
    Kind,
    Param,
    ParameterError,
    PluginType,
    configured,
)
from epp.config.precise import (
    KVEventsSettings,
    TokenizerSettings,
    precise_producer,
    token_producer,
)
from epp.extproc import parsers
from epp.scheduling import sessions
from epp.scheduling.admitters import NEVER_STALE, ProbabilisticAdmitter
from epp.scheduling.kvblocks import HashAlgorithm, PreciseConfig
from epp.scheduling.spec import PluginSpec

_TOKENIZER = TokenizerSettings()
_TOKENIZER_TIMEOUT = Param("timeout", T.DURATION, _TOKENIZER.timeout)
"""Every tokenizer backend's: how long a request waits for its tokens."""
_KV_EVENTS = KVEventsSettings()
_PRECISE = PreciseConfig()

TOKEN_PRODUCER_PARAMETERS = (
    Param("modelName", T.STRING, "", "model whose tokenizer the vllm backend uses"),
    Param(
        "vllm",
        T.OBJECT,
        None,
        "the vLLM /render backend",
        fields=(
            Param("url", T.STRING, _TOKENIZER.url),
            _TOKENIZER_TIMEOUT,
            Param("mmTimeout", T.DURATION, _TOKENIZER.mm_timeout),
        ),
        nullable=True,
    ),
    Param("estimate", T.ANY, None, "tokenizer-free estimate (the default backend)"),
    Param(
        "udsTokenizerConfig",
        T.OBJECT,
        None,
        "deprecated tokenizer sidecar on a Unix socket",
        fields=(
            Param("socketFile", T.STRING, "/tmp/tokenizer/tokenizer-uds.socket"),
            _TOKENIZER_TIMEOUT,
        ),
        nullable=True,
    ),
    Param(
        "local",
        T.OBJECT,
        None,
        "epp's own: a Hugging Face tokenizer.json from a model directory, in process",
        fields=(
            Param("modelDir", T.STRING, "", required=True),
            _TOKENIZER_TIMEOUT,
        ),
        nullable=True,
    ),
    Param(
        "maxConcurrency",
        T.INT,
        _TOKENIZER.max_concurrency,
        "epp's own: tokenizations in flight at once",
        1,
    ),
)

PRECISE_PRODUCER_PARAMETERS = (
    Param(
        "tokenProcessorConfig",
        T.OBJECT,
        None,
        "the servers' block hashing",
        fields=(
            Param("blockSize", T.INT, 0, "deprecated: use blockSizeTokens", 0),
            Param("blockSizeTokens", T.INT, 0, "tokens per block (vLLM --block-size; 0: 16)", 0),
            Param("hashSeed", T.STRING, "", "the servers' PYTHONHASHSEED"),
            Param(
                "hashAlgorithm",
                T.STRING,
                "",
                "the servers' --prefix-caching-hash-algo (default sha256_cbor); the "
                "reference's own key schemes cbor-fnv and xxh64 mean the default",
                choices=("", "cbor-fnv", "xxh64", *(a.value for a in HashAlgorithm)),
            ),
        ),
    ),
    Param(
        "indexerConfig",
        T.OBJECT,
        None,
        "the block index",
        fields=(
            Param(
                "kvBlockIndexConfig",
                T.OBJECT,
                None,
                fields=(
                    Param(
                        "inMemoryConfig",
                        T.OBJECT,
                        None,
                        fields=(
                            Param("size", T.INT, _PRECISE.index_size, "block keys kept", 1),
                            Param(
                                "podCacheSize",
                                T.INT,
                                _PRECISE.pods_per_key,
                                "endpoints kept per key",
                                1,
                            ),
                        ),
                    ),
                    Param("redisConfig", T.ANY, None, "a shared index in Redis (refused)"),
                    Param("costAwareMemoryConfig", T.ANY, None, "(refused)"),
                    Param("enableMetrics", T.BOOL, False, "epp always exports the metrics"),
                    Param("metricsLoggingInterval", T.ANY, None, "not used by epp"),
                ),
            ),
            Param("kvCacheBackendConfigs", T.ANY, None, "device-tier weights (not used)"),
            Param("tokenizersPoolConfig", T.ANY, None, "refused: use a token-producer"),
        ),
    ),
    Param(
        "kvEventsConfig",
        T.OBJECT,
        None,
        "where the KV-cache events come from",
        fields=(
            Param("zmqEndpoint", T.STRING, "", "a SUB socket to bind, servers connect to it"),
            Param("topicFilter", T.STRING, _KV_EVENTS.topic_filter),
            Param("concurrency", T.INT, 4, "event workers (epp applies events on its loop)", 1),
            Param("engineType", T.STRING, "vllm", choices=("vllm", "sglang")),
            Param("discoverPods", T.BOOL, _KV_EVENTS.discover_pods, "a subscriber per endpoint"),
            Param(
                "podDiscoveryConfig",
                T.OBJECT,
                None,
                fields=(
                    Param("podLabelSelector", T.STRING, ""),
                    Param("podNamespace", T.STRING, ""),
                    Param(
                        "socketPort",
                        T.INT,
                        _KV_EVENTS.socket_port,
                        "the servers' KV-events PUB port",
                        1,
                        65535,
                    ),
                    Param("replaySocketPort", T.INT, 0, "their replay ROUTER port (0: none)"),
                ),
            ),
        ),
    ),
    Param("speculativeIndexing", T.BOOL, False, "count a pick as cached until its event"),
    Param("speculativeTTL", T.DURATION, 2.0, "how long a speculative entry lives"),
)


def _inflight_load(parameters: Mapping[str, Any]) -> Configured:
    if parameters["addEstimatedOutputTokens"] or parameters["syncCrossReplicaState"]:
        raise ParameterError(
            "addEstimatedOutputTokens"
            if parameters["addEstimatedOutputTokens"]
            else "syncCrossReplicaState",
            "not supported: epp counts requests in flight per endpoint (its concurrency gate)",
        )
    return configured(parameters)


def _session_id_producer(parameters: Mapping[str, Any]) -> PluginSpec:
    header = parameters["headerName"].strip().lower()
    cookie = parameters["cookieName"].strip()
    if bool(header) == bool(cookie):
        raise ParameterError("", "exactly one of headerName or cookieName must be set")
    # The loader gives `name` the plugin's configured name (`spec.named`).
    arguments = {"name": "", "header": header, "cookie": cookie}
    return PluginSpec("", sessions.session_id_producer, tuple(sorted(arguments.items())))


ENTRIES: tuple[PluginType, ...] = (
    # -- parsers --------------------------------------------------------------
    PluginType(
        "openai-parser",
        Kind.PARSER,
        "OpenAI API bodies: completions, chat completions, responses, embeddings, conversations",
        factory=lambda p: parsers.OPENAI,
    ),
    PluginType(
        "anthropic-parser",
        Kind.PARSER,
        "Anthropic Messages API bodies (/v1/messages)",
        factory=lambda p: parsers.ANTHROPIC,
    ),
    PluginType(
        "vllmhttp-parser",
        Kind.PARSER,
        "vLLM's /inference/v1/generate (token ids or a prompt); other paths as openai-parser",
        factory=lambda p: parsers.VLLM_HTTP,
    ),
    PluginType(
        "passthrough-parser",
        Kind.PARSER,
        "no body parsing; requests are still routed",
        factory=lambda p: parsers.PASSTHROUGH,
    ),
    PluginType(
        "sglanghttp-parser",
        Kind.PARSER,
        "SGLang's native HTTP API bodies",
        refusal="SGLang's native request format is not parsed by epp",
    ),
    PluginType(
        "vllmgrpc-parser",
        Kind.PARSER,
        "vLLM gRPC request bodies",
        refusal="gRPC request bodies (vLLM's gRPC API) are not parsed by epp",
    ),
    PluginType(
        "vertexai-parser",
        Kind.PARSER,
        "Vertex AI request bodies",
        refusal="Vertex AI request bodies are not parsed by epp",
    ),
    # -- data producers ---------------------------------------------------------
    PluginType(
        "approx-prefix-cache-producer",
        Kind.PRODUCER,
        "hashes the prompt into blocks and matches them against a per-pod LRU index",
        (
            Param("autoTune", T.BOOL, True, "block size and capacity from the pods' metrics"),
            Param("blockSizeTokens", T.INT, 16, "tokens per block", 1),
            Param("maxPrefixBlocksToMatch", T.INT, 2048, "blocks hashed per request", 1),
            Param(
                "maxPrefixTokensToMatch",
                T.INT,
                131_072,
                "cap in tokens; wins over maxPrefixBlocksToMatch unless 0",
                0,
            ),
            Param("lruCapacityPerServer", T.INT, 31_250, "block hashes kept per pod", 1),
            Param("blockSize", T.INT, 0, "deprecated: block size in characters", 0),
        ),
        factory=configured,
    ),
    PluginType(
        "token-producer",
        Kind.PRODUCER,
        "tokenizes the prompt before scheduling: the model server's /render (vllm), the "
        "tokenizer sidecar (udsTokenizerConfig), a local tokenizer.json, or the estimate; "
        "a tokenizer down or slow past its timeout falls back to the estimate",
        TOKEN_PRODUCER_PARAMETERS,
        factory=token_producer,
    ),
    PluginType(
        "tokenizer",
        Kind.PRODUCER,
        "deprecated name of token-producer",
        TOKEN_PRODUCER_PARAMETERS,
        factory=token_producer,
        deprecated_for="token-producer",
    ),
    PluginType(
        "inflight-load-producer",
        Kind.PRODUCER,
        "counts requests in flight per pod to their end, uncached prompt tokens to the first token",
        (
            Param("addEstimatedOutputTokens", T.BOOL, False, "count estimated output tokens too"),
            Param("outputRatio", T.FLOAT, 1.5, "estimated output / input tokens", 0),
            Param("maxEstimatedOutputTokens", T.INT, None, "cap on estimated output tokens", 0),
            Param("prefixMatchInfoProducerName", T.STRING, ""),
            Param("syncCrossReplicaState", T.BOOL, None, "share counts between EPP replicas"),
        ),
        factory=_inflight_load,
    ),
    PluginType(
        "session-id-producer",
        Kind.PRODUCER,
        "publishes a header's or a cookie's session id as the attribute "
        "`SessionIDDataKey/` + its name",
        (
            Param("headerName", T.STRING, "", "header carrying the session id"),
            Param("cookieName", T.STRING, "", "cookie carrying the session id"),
        ),
        factory=_session_id_producer,
    ),
    PluginType(
        "precise-prefix-cache-producer",
        Kind.PRODUCER,
        "the precise prefix-cache index: vLLM's own block keys of the tokenized prompt, "
        "matched against the blocks the servers report over ZMQ (KV-cache events)",
        PRECISE_PRODUCER_PARAMETERS,
        factory=precise_producer,
    ),
    PluginType(
        "burst-prefix-cache-producer",
        Kind.PRODUCER,
        "co-locates prompt-sharing requests that arrive in a burst",
        refusal="batches requests over a time window by their tokenized prompts, which "
        "epp does not do",
        stability=ALPHA,
    ),
    PluginType(
        "mm-embeddings-cache-producer",
        Kind.PRODUCER,
        "tracks which pods recently encoded each multimodal input",
        refusal="needs multimodal input hashing (encoder cache), which epp does not do",
    ),
    PluginType(
        "predicted-latency-producer",
        Kind.PRODUCER,
        "per-pod TTFT and TPOT predictions from a trained model",
        refusal=NEEDS_LATENCY_PREDICTOR,
    ),
    PluginType(
        "p2p-source-producer",
        Kind.PRODUCER,
        "names the pod to pull KV cache from (x-kv-cache-source-host-port)",
        refusal="peer-to-peer KV-cache transfer is not supported by epp",
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-approx-prefix-cache-producer",
        Kind.PRODUCER,
        "prefix index over clusters",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    # -- admission and other request control -------------------------------------
    PluginType(
        "probabilistic-admitter",
        Kind.ADMITTER,
        "sheds sheddable requests with a probability rising with pool saturation",
        (
            Param(
                "queueDepthThreshold",
                T.INT,
                NEVER_STALE.queue_depth,
                "queue at which a pod counts saturated",
                0,
                None,
                True,
            ),
            Param(
                "kvCacheUtilThreshold",
                T.FLOAT,
                NEVER_STALE.kv_cache,
                "KV use at which a pod counts saturated",
                0,
                None,
                True,
            ),
            Param("power", T.FLOAT, 5.0, "steepness of the shedding curve", 0, None, True),
            Param("k", T.FLOAT, 300.0, "where shedding starts", 0, None, True),
        ),
        factory=lambda parameters: ProbabilisticAdmitter(
            replace(
                NEVER_STALE,
                queue_depth=parameters["queueDepthThreshold"],
                kv_cache=parameters["kvCacheUtilThreshold"],
            ),
            parameters["power"],
            parameters["k"],
        ),
    ),
    PluginType(
        "latency-slo-admitter",
        Kind.ADMITTER,
        "rejects requests predicted to miss their SLO",
        refusal=NEEDS_LATENCY_PREDICTOR,
    ),
    PluginType(
        "request-attribute-reporter",
        Kind.REQUEST_CONTROL,
        "reports request attributes as response metadata",
        refusal="request attributes are not reported by epp",
    ),
    PluginType(
        "models-responder",
        Kind.REQUEST_CONTROL,
        "answers GET /v1/models itself: the union of the pods' model lists (503 until one "
        "has reported); creates a models-data-source when none is declared",
        factory=configured,
        stability=ALPHA,
        source="pkg/epp/framework/plugins/requestcontrol/responder/models (after PR #2308)",
    ),
    PluginType(
        "outlen-bucket",
        Kind.REQUEST_CONTROL,
        "predicts a request's output-length bin from its thinking and tool fields",
        refusal="output lengths are not predicted from request fields by epp",
        stability=ALPHA,
        source="pkg/epp/framework/plugins/requestcontrol/requestheader/outlenbucket",
    ),
    PluginType(
        "dp-rank-header-handler",
        Kind.REQUEST_CONTROL,
        "pins a request to a data-parallel rank by X-data-parallel-rank",
        refusal="needs the precise prefix cache's per-rank matches; epp routes ranks by "
        "their ports (data-parallel-profile-handler)",
        source="deploy/config/dp-kvcache-epp-config.yaml",
    ),
    PluginType(
        "thunder-agent",
        Kind.REQUEST_CONTROL,
        "ThunderAgent: program-level admission and sticky placement for agentic sessions, "
        "one instance as scorer, saturation detector and fairness policy",
        refusal="program-level admission (ThunderAgent) is not implemented by epp",
        source="deploy/config/thunderagent-config.yaml",
    ),
    PluginType(
        "agent-identity",
        Kind.REQUEST_CONTROL,
        "derives the fairness id from an agent identity header",
        refusal="agent identities are not read by epp",
        stability=ALPHA,
    ),
    PluginType(
        "disaggregatedset-rollout-screener",
        Kind.REQUEST_CONTROL,
        "screens pods during a DisaggregatedSet rollout",
        refusal="DisaggregatedSet rollouts are not watched by epp",
        stability=ALPHA,
    ),
    PluginType(
        "destination-endpoint-served-verifier",
        Kind.REQUEST_CONTROL,
        "the reference's test plugin",
        refusal="a test-only plugin of the reference",
    ),
)
