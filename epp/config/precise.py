"""The precise prefix-cache pipeline's plugins as configured: `token-producer`
(which tokenizer, how long to wait for it) and `precise-prefix-cache-producer`
(the servers' block hashing, the index's bounds, where the KV-cache events
come from), with the reference's parameter names
(`pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/` and
`.../preciseprefixcache/`, `pkg/kvevents/pool.go`, `pkg/kvcache/kvblock/`).

Their parameter schemas are in `epp.config.catalog.requests`. The
factories return plain values; `epp.config.sections.precise` puts the
producer's core part into `SchedulingConfig.precise` and the shell parts
(`TokenizerSettings`, `KVEventsSettings`) into `EppConfig`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from epp.config.plugin import ParameterError, Unsupported
from epp.scheduling.kvblocks import BlockHasher, HashAlgorithm, PreciseConfig


class TokenizerBackend(enum.Enum):
    ESTIMATE = "estimate"
    VLLM = "vllm"
    """The model server's `/v1/completions/render` and `/v1/chat/completions/render`."""
    UDS = "uds"
    """The reference's deprecated tokenizer sidecar over a Unix socket."""
    LOCAL = "local"
    """A Hugging Face `tokenizer.json` from a model directory, in process."""


@dataclass(slots=True, frozen=True)
class TokenizerSettings:
    """A `token-producer`: the backend, the model named in render requests,
    and how long a request waits for its tokens before it is scheduled with
    the estimate instead (`timeout`, `mm_timeout` for multimodal bodies)."""

    backend: TokenizerBackend = TokenizerBackend.ESTIMATE
    model_name: str = ""
    url: str = "http://localhost:8000"
    timeout: float = 5.0
    mm_timeout: float = 30.0
    socket_file: str = ""
    model_dir: str = ""
    max_concurrency: int = 64
    """Tokenizations in flight at once (past it a request takes the estimate)."""

    @property
    def keeps_prefix_store(self) -> bool:
        """Whether the backend encodes only what its prefix store does not
        hold (`epp.serve.token_store`): the local one, which has offsets."""
        return self.backend is TokenizerBackend.LOCAL


def token_producer(parameters: Mapping[str, Any]) -> TokenizerSettings:
    chosen = [key for key in ("vllm", "udsTokenizerConfig", "local") if parameters[key] is not None]
    if len(chosen) > 1:
        raise ParameterError("", f"at most one backend may be set, got {', '.join(chosen)}")
    base = TokenizerSettings(
        model_name=parameters["modelName"], max_concurrency=parameters["maxConcurrency"]
    )
    if not chosen:
        return base
    if chosen[0] == "vllm":
        vllm = parameters["vllm"]
        if not base.model_name:
            raise ParameterError("modelName", "required with the vllm backend")
        url = vllm["url"].rstrip("/")
        if not url.startswith("http://"):
            raise ParameterError("vllm.url", f"must be a plain http:// URL, got {url!r}")
        return replace(
            base,
            backend=TokenizerBackend.VLLM,
            url=url,
            timeout=vllm["timeout"],
            mm_timeout=vllm["mmTimeout"],
        )
    if chosen[0] == "udsTokenizerConfig":
        uds = parameters["udsTokenizerConfig"]
        return replace(
            base,
            backend=TokenizerBackend.UDS,
            timeout=uds["timeout"],
            socket_file=uds["socketFile"],
        )
    local = parameters["local"]
    return replace(
        base, backend=TokenizerBackend.LOCAL, timeout=local["timeout"], model_dir=local["modelDir"]
    )


@dataclass(slots=True, frozen=True)
class KVEventsSettings:
    """Where the servers' KV-cache events come from (`kvEventsConfig`): with
    `discover_pods`, a SUB socket per endpoint on its address at
    `socket_port` (+ its data-parallel rank), with the replay socket at
    `replay_port` when that is positive; with `zmq_endpoint`, one SUB socket
    bound there that the servers connect to, each known by its topic
    (`kv@<pod address>@<model>`). Only topics starting with `topic_filter`
    are read."""

    zmq_endpoint: str = ""
    topic_filter: str = "kv@"
    discover_pods: bool = True
    socket_port: int = 5557
    replay_port: int = -1


@dataclass(slots=True, frozen=True)
class PreciseProducer:
    """What a `precise-prefix-cache-producer` configures: the core's part
    (its `name` set by the loader) and the event subscribers'."""

    precise: PreciseConfig
    events: KVEventsSettings


def precise_producer(parameters: Mapping[str, Any]) -> PreciseProducer:
    name = "precise-prefix-cache-producer"
    tokens = parameters["tokenProcessorConfig"]
    size = tokens["blockSizeTokens"] or tokens["blockSize"] or 16
    algorithm = tokens["hashAlgorithm"]
    hasher = BlockHasher(
        size,
        tokens["hashSeed"],
        HashAlgorithm(algorithm)
        if algorithm not in ("", "cbor-fnv", "xxh64")
        else HashAlgorithm.SHA256_CBOR,
    )
    indexer = parameters["indexerConfig"]
    if indexer["tokenizersPoolConfig"] is not None:
        raise ParameterError(
            "indexerConfig.tokenizersPoolConfig",
            "not supported; configure a token-producer plugin instead",
        )
    block_index = indexer["kvBlockIndexConfig"]
    for backend in ("redisConfig", "costAwareMemoryConfig"):
        if block_index[backend] is not None:
            raise Unsupported(
                name, f"indexerConfig.kvBlockIndexConfig.{backend}: epp keeps the index in memory"
            )
    memory = block_index["inMemoryConfig"]
    events = parameters["kvEventsConfig"]
    if events["engineType"] != "vllm":
        raise Unsupported(name, "engineType sglang: epp decodes vLLM's KV-cache events")
    discovery = events["podDiscoveryConfig"]
    return PreciseProducer(
        PreciseConfig(
            name,
            hasher,
            index_size=memory["size"],
            pods_per_key=memory["podCacheSize"],
            speculative_ttl=parameters["speculativeTTL"]
            if parameters["speculativeIndexing"]
            else None,
        ),
        KVEventsSettings(
            events["zmqEndpoint"],
            events["topicFilter"],
            events["discoverPods"],
            discovery["socketPort"],
            discovery["replaySocketPort"] if discovery["replaySocketPort"] > 0 else -1,
        ),
    )
