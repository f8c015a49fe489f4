"""The precise prefix cache's metrics, in the catalogue's order: the
KV-block index, the KV-cache event subscribers, the prefix indexer and the
token producer (the reference's `llm_d_epp_prefix_*` and `kv_cache_*`
series, `pkg/kvcache/metrics/collector.go`).
"""

from __future__ import annotations

from epp.serve.metrics.spec import Spec, Twin
from epp.serve.metrics.vocabulary import (
    EXTENSION,
    HIT_BYTES_BUCKETS,
    HIT_RATIO_BUCKETS,
    INPUT_TOKEN_BUCKETS,
    KVCACHE_INDEX,
    LOOKUP_BUCKETS,
    PLUGIN,
    POD,
    C,
    G,
    H,
    P,
)


def _index_counter(noun: str, text: str) -> Spec:
    name = f"{P}kv_cache_index_{noun}_total"
    twin = Twin(f"{KVCACHE_INDEX}{noun}_total", help=f"Deprecated: use {name}. {text}")
    return Spec(name, C, text + ".", twin=twin)


PREFIX_CACHE: tuple[Spec, ...] = (
    _index_counter("admissions", "Total number of KV-block admissions"),
    _index_counter("evictions", "Total number of KV-block evictions"),
    _index_counter("lookup_requests", "Total number of lookup calls"),
    _index_counter("lookup_hits", "Contiguous prefix blocks matched by the best pod per lookup"),
    _index_counter(
        "max_pod_hit_count", "Longest contiguous per-pod prefix chain observed per lookup"
    ),
    Spec(
        P + "kv_cache_index_lookup_latency_seconds",
        H,
        "Latency of Lookup calls in seconds.",
        buckets=LOOKUP_BUCKETS,
        twin=Twin(
            KVCACHE_INDEX + "lookup_latency_seconds",
            help=f"Deprecated: use {P}kv_cache_index_lookup_latency_seconds. Latency of "
            "Lookup calls in seconds",
        ),
    ),
    Spec(
        P + "kv_cache_index_blocks",
        G,
        "Block keys the precise index holds (some endpoint reported storing each).",
    ),
    Spec(
        P + "kv_cache_index_former_blocks",
        G,
        "Block keys kept of what restarted endpoints held before their restart, until each "
        "evicts again (a session no endpoint holds now goes back there); counted against "
        "the capacity.",
    ),
    Spec(
        P + "kv_cache_index_capacity_blocks",
        G,
        "The precise index's limit in block keys (inMemoryConfig.size); past it the least "
        "recently stored key is evicted.",
    ),
    Spec(
        P + "kv_cache_index_removals_unknown_total",
        C,
        "BlockRemoved events for blocks the endpoint was not known to hold.",
    ),
    Spec(
        P + "kv_cache_events_active_subscribers",
        G,
        "Number of ZMQ subscribers currently managed, including those retrying a failed "
        "connection.",
    ),
    Spec(
        P + "kv_cache_events_subscriber_reconnections_total",
        C,
        "Times a subscriber's publisher came back after a disconnection (its blocks are "
        "dropped and replayed).",
        POD,
    ),
    Spec(
        P + "kv_cache_events_messages_received_total",
        C,
        "Total number of messages received from ZMQ subscribers.",
        POD,
    ),
    Spec(
        P + "kv_cache_events_zmq_errors_total",
        C,
        "Total number of ZMQ subscriber errors.",
        (*POD, "operation"),
    ),
    Spec(
        P + "kv_cache_events_applied_total",
        C,
        "KV-cache events applied to the precise index, by type.",
        ("type",),
    ),
    Spec(
        P + "kv_cache_events_dropped_total",
        C,
        "KV-cache events or batches dropped, by reason (malformed, unknown-type, "
        "malformed-batch, malformed-frame, unknown-pod).",
        ("reason",),
    ),
    Spec(
        P + "kv_cache_events_sequence_gaps_total",
        C,
        "Batches missing from a publisher's sequence.",
    ),
    Spec(
        P + "kv_cache_events_replays_total",
        C,
        "Replays asked of the servers' replay sockets, by result.",
        ("result",),
    ),
    Spec(
        P + "kv_cache_events_resets_total",
        C,
        "Times a server's blocks were dropped because it restarted or reconnected.",
    ),
    Spec(
        P + "prefix_indexer_size",
        G,
        "Blocks the approximate prefix index holds, over every endpoint.",
        PLUGIN,
        twin=Twin(EXTENSION + "prefix_indexer_size", ()),
    ),
    Spec(
        P + "prefix_indexer_hit_ratio",
        H,
        "Ratio of prefix length matched to total prefix length in the cache lookup, on the "
        "endpoint chosen.",
        PLUGIN,
        HIT_RATIO_BUCKETS,
        Twin(EXTENSION + "prefix_indexer_hit_ratio", ()),
    ),
    Spec(
        P + "prefix_indexer_hit_bytes",
        H,
        "Length of the prefix match in bytes (4 a token) in the cache lookup, on the "
        "endpoint chosen.",
        PLUGIN,
        HIT_BYTES_BUCKETS,
        Twin(EXTENSION + "prefix_indexer_hit_bytes", ()),
    ),
    Spec(
        P + "prefix_predicted_cached_tokens",
        H,
        "Prompt tokens the prefix-cache producer's index predicted cached on the endpoint "
        "chosen, per request.",
        PLUGIN,
        INPUT_TOKEN_BUCKETS,
    ),
    Spec(
        P + "prefix_prompt_tokens",
        H,
        "Prompt tokens of the requests the prefix-cache producer predicted for (the "
        "denominator of the predicted hit rate).",
        PLUGIN,
        INPUT_TOKEN_BUCKETS,
    ),
    Spec(
        P + "token_producer_tokenized_total",
        C,
        "Requests the token-producer tokenized with its backend.",
    ),
    Spec(
        P + "token_producer_fallbacks_total",
        C,
        "Requests scheduled with the estimated token count because the tokenizer timed "
        "out, failed or was busy, by reason.",
        ("reason",),
    ),
    Spec(
        P + "token_producer_cache_entries",
        G,
        "What the token-producer's bounded caches hold, by cache: prefix-store (blocks of "
        "prompt tokens), digest-memo (block digests), learning (prompts being encoded off "
        "their path); summed over the protocol workers.",
        ("cache",),
    ),
    Spec(
        P + "token_producer_cache_capacity",
        G,
        "The limit of each of the token-producer's caches (--token-store-blocks, "
        "--digest-memo-entries, --tokenizer-max-learning), summed over the protocol workers.",
        ("cache",),
    ),
    Spec(
        P + "token_producer_cache_dropped_total",
        C,
        "What the token-producer's caches let go at their limit, by cache: prefix-store "
        "blocks evicted, digest-memo digests dropped when it started over, learning prompts "
        "not learned.",
        ("cache",),
    ),
)
