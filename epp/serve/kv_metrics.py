"""The precise prefix cache's Prometheus series, read at scrape time from
the core's index counters and the KV-event subscribers' stats, under the
reference's names (`pkg/kvcache/metrics/collector.go`): the `llm_d_epp_`
series and, for the index counters, their deprecated `kvcache_index_` twins.
Beside them, epp's own: the blocks held and the index's limit, events
applied and dropped by reason, sequence gaps, replays and resets."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.datalayer.kvevents import KVEventStats
from epp.scheduling.kvblocks import KVBlockIndex
from epp.serve.tokenizer import TokenizerStats

CURRENT = "llm_d_epp_"

_INDEX_COUNTERS = (
    ("admissions", "kv_cache_index_admissions", "Total number of KV-block admissions"),
    ("evictions", "kv_cache_index_evictions", "Total number of KV-block evictions"),
    ("lookups", "kv_cache_index_lookup_requests", "Total number of lookup calls"),
    (
        "lookup_hits",
        "kv_cache_index_lookup_hits",
        "Contiguous prefix blocks matched by the best pod per lookup",
    ),
    (
        "max_pod_hits",
        "kv_cache_index_max_pod_hit_count",
        "Longest contiguous per-pod prefix chain observed per lookup",
    ),
)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


class KVCacheCollector(Collector):
    """`index()` is the core's precise index now (it survives reloads, but
    read it each scrape), `stats` the subscribers'."""

    def __init__(self, index: Callable[[], KVBlockIndex | None], stats: KVEventStats) -> None:
        self._index = index
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        index = self._index()
        if index is not None:
            counters = index.counters
            for attribute, name, documentation in _INDEX_COUNTERS:
                value = getattr(counters, attribute)
                yield _counter(CURRENT + name, documentation, value)
                legacy = "kvcache_index_" + name.removeprefix("kv_cache_index_")
                yield _counter(legacy, f"Deprecated: use {CURRENT}{name}. {documentation}", value)
            yield GaugeMetricFamily(
                CURRENT + "kv_cache_index_blocks",
                "Block keys the precise index holds (some endpoint reported storing each)",
                value=len(index),
            )
            yield GaugeMetricFamily(
                CURRENT + "kv_cache_index_capacity_blocks",
                "The precise index's limit in block keys (inMemoryConfig.size); past it the "
                "least recently stored key is evicted",
                value=index.size,
            )
            yield _counter(
                CURRENT + "kv_cache_index_removals_unknown",
                "BlockRemoved events for blocks the endpoint was not known to hold",
                counters.removed_unknown,
            )
        stats = self._stats
        yield GaugeMetricFamily(
            CURRENT + "kv_cache_events_active_subscribers",
            "Number of ZMQ subscribers currently managed, including those retrying a failed "
            "connection",
            value=stats.active,
        )
        messages = CounterMetricFamily(
            CURRENT + "kv_cache_events_messages_received",
            "Total number of messages received from ZMQ subscribers",
            labels=["pod_identifier"],
        )
        for pod, count in sorted(stats.messages.items()):
            messages.add_metric([pod], count)
        yield messages
        errors = CounterMetricFamily(
            CURRENT + "kv_cache_events_zmq_errors",
            "Total number of ZMQ subscriber errors",
            labels=["pod_identifier", "operation"],
        )
        for (pod, operation), count in sorted(stats.errors.items()):
            errors.add_metric([pod, operation], count)
        yield errors
        applied = CounterMetricFamily(
            CURRENT + "kv_cache_events_applied",
            "KV-cache events applied to the precise index, by type",
            labels=["type"],
        )
        for kind, count in sorted(stats.events.items()):
            applied.add_metric([kind], count)
        yield applied
        dropped = CounterMetricFamily(
            CURRENT + "kv_cache_events_dropped",
            "KV-cache events or batches dropped, by reason (malformed, unknown-type, "
            "malformed-batch, malformed-frame, unknown-pod)",
            labels=["reason"],
        )
        for reason, count in sorted(stats.dropped.items()):
            dropped.add_metric([reason], count)
        yield dropped
        yield _counter(
            CURRENT + "kv_cache_events_sequence_gaps",
            "Batches missing from a publisher's sequence",
            stats.gaps,
        )
        replays = CounterMetricFamily(
            CURRENT + "kv_cache_events_replays",
            "Replays asked of the servers' replay sockets, by result",
            labels=["result"],
        )
        for result, count in sorted(stats.replays.items()):
            replays.add_metric([result], count)
        yield replays
        yield _counter(
            CURRENT + "kv_cache_events_resets",
            "Times a server's blocks were dropped because it restarted or reconnected",
            stats.resets,
        )


class TokenProducerCollector(Collector):
    """The token producer's requests tokenized and left with the estimate."""

    def __init__(self, stats: TokenizerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield _counter(
            CURRENT + "token_producer_tokenized",
            "Requests the token-producer tokenized with its backend",
            self._stats.tokenized,
        )
        fallbacks = CounterMetricFamily(
            CURRENT + "token_producer_fallbacks",
            "Requests scheduled with the estimated token count because the tokenizer "
            "timed out, failed or was busy, by reason",
            labels=["reason"],
        )
        for reason in ("timeout", "error", "busy"):
            fallbacks.add_metric([reason], self._stats.fallbacks[reason])
        yield fallbacks
