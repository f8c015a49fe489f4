"""The metrics read at scrape time from what the EPP already holds: the
pool's gauges from the endpoint store, the gate's saturation and learned
limits, the credits in use, the scraper's failures, the transport's
connections and limit trips, the session bindings.

- Pool (`PoolCollector`): `average_*` and `std_dev_*` and `ready_endpoints`
  over the endpoints whose metrics are fresh (`--metrics-staleness-threshold`),
  `per_endpoint_queue_size` for every endpoint, and, for each endpoint with
  a good latest read, ours: `epp_per_endpoint_kv_cache_utilization`,
  `_running_requests` and `_metrics_age_seconds` (how old the EPP's view is).
- Saturation (`SaturationCollector`): `flow_control_pool_saturation{stage}`,
  `effective` as the configured gate sees it and, with a `StageView`,
  `decode` and `prefill` over each stage's endpoints (the saturation rule,
  partitioned by role as the reference does), with
  `flow_control_stale_endpoints{detector}` and ours,
  `epp_flow_control_queue_size_by_stage`: the queued requests under the
  stage whose lack of room holds the queue (`effective`: the gate is closed).
- Data layer (`ScrapeFailures`): the reference's poll errors (the page could
  not be read) and extract errors (read, not understood), and ours by reason
  (`timeout`, `connection`, `http-status`, `not-prometheus-text`,
  `too-large`: poll errors; `unreadable`: an extract error), kept because
  the reason is what an operator acts on.
- The adaptive gate's learned limit, headroom and adjustments per endpoint
  (the reference learns no limit); credits in use per stage; each gRPC
  port's connections and limit trips; bindings per `session_id` plugin and
  those its `maxSessions` dropped.
- The precise prefix cache (`KVCacheCollector`): the index's counters under
  the reference's names (`pkg/kvcache/metrics/collector.go`, with their
  `kvcache_index_` twins), the subscribers' messages and errors per pod; and
  ours: the blocks held against the index's limit, events applied and
  dropped, sequence gaps, replays and resets. The token producer's
  tokenized requests and fallbacks by reason (`TokenProducerCollector`).
  The approximate prefix index's size per producer (`PrefixIndexCollector`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.scheduling.cache_scorers import PrefixCacheScorer
from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.sessions import SessionBindings
from epp.serve.metrics.series import scraped
from epp.serve.metrics.vocabulary import P

if TYPE_CHECKING:
    from epp.datalayer.kvevents import KVEventStats
    from epp.scheduling.kvblocks import KVBlockIndex
    from epp.serve.tokenizer import TokenizerStats

METRICS_SOURCE = "metrics-data-source"
METRICS_EXTRACTOR = "core-metrics-extractor"
EXTRACT_FAILURES = frozenset({"unreadable"})
"""The scrape failure reasons where the page was read but not understood: the
reference counts those as extract errors, the rest as poll errors."""


class ScrapeFailures(Collector):
    def __init__(self, failures: Callable[[], Mapping[str, int]]) -> None:
        self._failures = failures

    def collect(self) -> Iterator[Metric]:
        failures = sorted(self._failures().items())
        yield from scraped("epp_model_server_scrape_failures_total", [
            ((reason,), count) for reason, count in failures
        ])  # fmt: skip
        extracts = sum(count for reason, count in failures if reason in EXTRACT_FAILURES)
        polls = sum(count for _, count in failures) - extracts
        yield from scraped(P + "datalayer_poll_errors_total", [((METRICS_SOURCE,), polls)])
        yield from scraped(
            P + "datalayer_extract_errors_total", [((METRICS_SOURCE, METRICS_EXTRACTOR), extracts)]
        )


@dataclass(slots=True, frozen=True)
class StageView:
    """What the pool-saturation collector reads per stage, at scrape time."""

    saturation: Callable[[], Mapping[str, float]]
    """Each stage's saturation (`decode`, and `prefill` when the pool has
    prefill endpoints)."""
    stale: Callable[[], tuple[str, int]]
    """(who reads staleness, how many endpoints' metrics are stale)."""
    queued: Callable[[], Mapping[str, int]]
    """The queued requests by the stage whose lack of room holds them."""


class SaturationCollector(Collector):
    def __init__(
        self, pool_name: str, saturation: Callable[[], float], stages: StageView | None
    ) -> None:
        self._pool_name = pool_name
        self._saturation = saturation
        self._stages = stages

    def collect(self) -> Iterator[Metric]:
        readings = {"effective": self._saturation()}
        stages = self._stages
        if stages is not None:
            readings.update(stages.saturation())
        pool = self._pool_name
        yield from scraped(P + "flow_control_pool_saturation", [
            ((pool, stage), value) for stage, value in readings.items()
        ])  # fmt: skip
        if stages is None:
            return
        reader, count = stages.stale()
        yield from scraped(P + "flow_control_stale_endpoints", [((reader,), count)])
        yield from scraped("epp_flow_control_queue_size_by_stage", [
            ((pool, stage), count) for stage, count in stages.queued().items()
        ])  # fmt: skip


class LimitsCollector(Collector):
    def __init__(self, pool_name: str, gate: AdaptiveGate) -> None:
        self._pool_name = pool_name
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        gate = self._gate
        adjustments = [((self._pool_name, address), n) for address, n in gate.adjustments().items()]
        yield from scraped(P + "flow_control_endpoint_limit", [
            (where, gate.limit_of(where[1])) for where, _ in adjustments
        ])  # fmt: skip
        yield from scraped(P + "flow_control_endpoint_headroom", [
            (where, gate.headroom_of(where[1])) for where, _ in adjustments
        ])  # fmt: skip
        yield from scraped(P + "flow_control_endpoint_limit_adjustments_total", adjustments)


class CreditsCollector(Collector):
    def __init__(self, pool_name: str, in_flight: Callable[[], dict[str, int]]) -> None:
        self._pool_name = pool_name
        self._in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        yield from scraped("epp_flow_control_credits_in_use", [
            ((self._pool_name, stage), count) for stage, count in self._in_flight().items()
        ])  # fmt: skip


class SessionsCollector(Collector):
    def __init__(self, pool_name: str, stores: Callable[[], Mapping[str, SessionBindings]]) -> None:
        self._pool_name = pool_name
        self._stores = stores

    def collect(self) -> Iterator[Metric]:
        stores = sorted(self._stores().items())
        pool = self._pool_name
        yield from scraped("epp_session_bindings", [
            ((pool, name), len(bindings)) for name, bindings in stores
        ])  # fmt: skip
        yield from scraped("epp_session_bindings_dropped_total", [
            ((pool, name), bindings.dropped) for name, bindings in stores
        ])  # fmt: skip


class PoolCollector(Collector):
    def __init__(
        self,
        pool_name: str,
        snapshot: Callable[[], PoolSnapshot],
        staleness: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool_name = pool_name
        self._snapshot = snapshot
        self._staleness = staleness
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        pool = self._snapshot()
        now = self._clock()
        fresh = [e.metrics for e in pool.endpoints if not e.metrics.is_stale(now, self._staleness)]
        name = (self._pool_name,)
        yield from scraped(P + "ready_endpoints", [(name, len(fresh))])
        if fresh:
            for field, noun in (
                ("kv_usage", "kv_cache_utilization"),
                ("waiting", "queue_size"),
                ("running", "running_requests"),
            ):
                values = [getattr(metrics, field) for metrics in fresh]
                yield from scraped(f"{P}average_{noun}", [(name, statistics.fmean(values))])
                yield from scraped(f"{P}std_dev_{noun}", [(name, statistics.pstdev(values))])
        if not pool.endpoints:
            return
        yield from scraped(P + "per_endpoint_queue_size", [
            ((self._pool_name, endpoint.name), endpoint.metrics.waiting)
            for endpoint in pool.endpoints
        ])  # fmt: skip
        read = [
            endpoint
            for endpoint in pool.endpoints
            if endpoint.metrics.updated_at is not None and not endpoint.metrics.failing
        ]
        for metric, value in (
            ("kv_cache_utilization", lambda metrics: metrics.kv_usage),
            ("running_requests", lambda metrics: metrics.running),
            ("metrics_age_seconds", lambda metrics: max(0.0, now - metrics.updated_at)),
        ):
            yield from scraped(f"epp_per_endpoint_{metric}", [
                ((self._pool_name, endpoint.name), value(endpoint.metrics)) for endpoint in read
            ])  # fmt: skip


class TransportCounts(Protocol):
    """What the transport series read of one port: a `GrpcServer`, or the
    workers' ext_proc port summed (`epp.serve.owner.WorkersTransport`)."""

    @property
    def trips(self) -> Mapping[str, int]: ...

    @property
    def open_connections(self) -> int: ...


class TransportCollector(Collector):
    def __init__(self, servers: Mapping[str, TransportCounts]) -> None:
        self._servers = servers

    def collect(self) -> Iterator[Metric]:
        servers = self._servers.items()
        yield from scraped("epp_transport_limit_trips_total", [
            ((port, limit), count)
            for port, server in servers
            for limit, count in sorted(server.trips.items())
        ])  # fmt: skip
        yield from scraped("epp_transport_connections", [
            ((port,), server.open_connections) for port, server in servers
        ])  # fmt: skip


_INDEX_COUNTERS = (
    ("admissions", "admissions"),
    ("evictions", "evictions"),
    ("lookups", "lookup_requests"),
    ("lookup_hits", "lookup_hits"),
    ("max_pod_hits", "max_pod_hit_count"),
)
"""(`IndexCounters` attribute, the metric's noun)."""


class KVCacheCollector(Collector):
    """`index()` is the core's precise index now (it survives reloads, but
    is read each scrape), `stats` the subscribers'."""

    def __init__(self, index: Callable[[], KVBlockIndex | None], stats: KVEventStats) -> None:
        self._index = index
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        index = self._index()
        if index is not None:
            counters = index.counters
            for attribute, noun in _INDEX_COUNTERS:
                value = getattr(counters, attribute)
                yield from scraped(f"{P}kv_cache_index_{noun}_total", [((), value)])
            yield from scraped(P + "kv_cache_index_blocks", [((), len(index))])
            yield from scraped(P + "kv_cache_index_former_blocks", [((), index.former_keys())])
            yield from scraped(P + "kv_cache_index_capacity_blocks", [((), index.size)])
            yield from scraped(
                P + "kv_cache_index_removals_unknown_total", [((), counters.removed_unknown)]
            )
        stats = self._stats
        yield from scraped(P + "kv_cache_events_active_subscribers", [((), stats.active)])
        yield from scraped(P + "kv_cache_events_subscriber_reconnections_total", [
            ((pod,), count) for pod, count in sorted(stats.reconnections.items())
        ])  # fmt: skip
        yield from scraped(P + "kv_cache_events_messages_received_total", [
            ((pod,), count) for pod, count in sorted(stats.messages.items())
        ])  # fmt: skip
        yield from scraped(P + "kv_cache_events_zmq_errors_total", [
            (key, count) for key, count in sorted(stats.errors.items())
        ])  # fmt: skip
        for noun, counts in (
            ("applied", stats.events),
            ("dropped", stats.dropped),
            ("replays", stats.replays),
        ):
            yield from scraped(f"{P}kv_cache_events_{noun}_total", [
                ((label,), count) for label, count in sorted(counts.items())
            ])  # fmt: skip
        yield from scraped(P + "kv_cache_events_sequence_gaps_total", [((), stats.gaps)])
        yield from scraped(P + "kv_cache_events_resets_total", [((), stats.resets)])


FALLBACK_REASONS = ("timeout", "error", "busy")


class TokenProducerCollector(Collector):
    """The token producer's requests tokenized and left with the estimate."""

    def __init__(self, stats: TokenizerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        yield from scraped(P + "token_producer_tokenized_total", [((), stats.tokenized)])
        yield from scraped(P + "token_producer_fallbacks_total", [
            ((reason,), stats.fallbacks[reason]) for reason in FALLBACK_REASONS
        ])  # fmt: skip
        rows = sorted(stats.caches().items())
        yield from scraped(P + "token_producer_cache_entries", [
            ((name,), use.entries) for name, use in rows
        ])  # fmt: skip
        yield from scraped(P + "token_producer_cache_capacity", [
            ((name,), use.capacity) for name, use in rows
        ])  # fmt: skip
        yield from scraped(P + "token_producer_cache_dropped_total", [
            ((name,), use.dropped) for name, use in rows
        ])  # fmt: skip


WorkerCounts = Callable[[], Iterator[tuple[str, int, int, int]]]
"""(worker, requests, connections, restarts) of each protocol worker."""


class WorkersCollector(Collector):
    def __init__(self, counts: WorkerCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = list(self._counts())
        for column, name in enumerate(("requests", "connections", "restarts"), start=1):
            yield from scraped(f"epp_worker_{name}_total", [
                ((row[0],), row[column]) for row in counts
            ])  # fmt: skip


ReplicaStats = Callable[[], Iterable[tuple[str, tuple[str, ...], float]]]
"""(series, label values, value) rows of a replica or a decider."""


class ReplicasCollector(Collector):
    """A replica's and a decider's own series (`epp.serve.replica`,
    `epp.serve.decider`); a series both report (in cluster mode a replica is
    both) is their sum, so each family is written once."""

    def __init__(self, *stats: ReplicaStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        rows: dict[str, dict[tuple[str, ...], float]] = {}
        for stats in self._stats:
            for name, labels, value in stats():
                found = rows.setdefault(name, {})
                found[labels] = found.get(labels, 0.0) + value
        for name, found in rows.items():
            yield from scraped(name, list(found.items()))


class PrefixIndexCollector(Collector):
    """The approximate prefix index's size, per producer (`plugins()` are the
    scheduler's plugins now: a reload may bring another index)."""

    def __init__(self, plugins: Callable[[], Iterable[object]]) -> None:
        self._plugins = plugins

    def collect(self) -> Iterator[Metric]:
        sizes: dict[tuple[str, str], int] = {}
        for plugin in self._plugins():
            if type(plugin) is PrefixCacheScorer:  # the precise index has its own series
                sizes[plugin.producer] = plugin.index_entries()
        yield from scraped(P + "prefix_indexer_size", list(sizes.items()))
