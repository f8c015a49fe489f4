"""The `/metrics` page: `EppMetrics` (the per-request recorder plus the
scrape-time collectors on one registry) and the HTTP server that serves it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.sessions import SessionBindings
from epp.serve.metrics.collectors import (
    CreditsCollector,
    KVCacheCollector,
    LimitsCollector,
    PoolCollector,
    PrefixIndexCollector,
    ReplicasCollector,
    ReplicaStats,
    SaturationCollector,
    ScrapeFailures,
    SessionsCollector,
    StageView,
    TokenProducerCollector,
    TransportCollector,
    TransportCounts,
    WorkerCounts,
    WorkersCollector,
)
from epp.serve.metrics.recorder import RequestMetrics

if TYPE_CHECKING:
    from epp.datalayer.kvevents import KVEventStats
    from epp.scheduling.kvblocks import KVBlockIndex
    from epp.serve.tokenizer import TokenizerStats


class EppMetrics(RequestMetrics):
    """The EPP's metrics: the per-request hooks (`RequestMetrics`) and the
    `watch_*` methods that add the scrape-time collectors."""

    def watch_core(self, saturation: Callable[[], float], stages: StageView | None = None) -> None:
        """Report the pool's saturation as the gate sees it, and with
        `stages` per stage, the stale endpoints and the queue by the stage
        holding it, at scrape time."""
        self.registry.register(SaturationCollector(self.pool_name, saturation, stages))

    def watch_limits(self, gate: AdaptiveGate) -> None:
        """Report the adaptive gate's learned limits at scrape time."""
        self.registry.register(LimitsCollector(self.pool_name, gate))

    def watch_credits(self, in_flight: Callable[[], dict[str, int]]) -> None:
        """Report the in-flight credits in use per stage (`decode`, and
        `prefill` under P/D), at scrape time: `epp_flow_control_credits_in_use`."""
        self.registry.register(CreditsCollector(self.pool_name, in_flight))

    def watch_pool(
        self,
        snapshot: Callable[[], PoolSnapshot],
        staleness: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Report the pool's gauges from the endpoints' metrics, at scrape time."""
        self.registry.register(PoolCollector(self.pool_name, snapshot, staleness, clock))

    def watch_scrapes(self, failures: Callable[[], Mapping[str, int]]) -> None:
        """Report the scraper's failed reads, by reason, at scrape time."""
        self.registry.register(ScrapeFailures(failures))

    def watch_transport(self, servers: Mapping[str, TransportCounts]) -> None:
        """Report each gRPC port's open connections and limit trips at scrape time."""
        self.registry.register(TransportCollector(servers))

    def watch_workers(self, counts: WorkerCounts) -> None:
        """Report each protocol worker's requests, connections and restarts at scrape time."""
        self.registry.register(WorkersCollector(counts))

    def watch_replicas(self, *stats: ReplicaStats) -> None:
        """Report a replica's and a decider's state at scrape time."""
        self.registry.register(ReplicasCollector(*stats))

    def watch_sessions(self, stores: Callable[[], Mapping[str, SessionBindings]]) -> None:
        """Report the session bindings per plugin, and how many its limit
        dropped, at scrape time."""
        self.registry.register(SessionsCollector(self.pool_name, stores))

    def watch_kv_cache(self, index: Callable[[], KVBlockIndex | None], stats: KVEventStats) -> None:
        """Report the precise index's counters and the KV-event subscribers'
        stats at scrape time; time its lookups (`kv_cache_index_lookup_latency_seconds`)."""
        self.registry.register(KVCacheCollector(index, stats))
        found = index()
        if found is not None:
            found.watch_lookups(time.perf_counter, self.kv_lookups.tally(()).add)

    def watch_prefix_index(self, plugins: Callable[[], Iterable[object]]) -> None:
        """Report the approximate prefix index's size at scrape time."""
        self.registry.register(PrefixIndexCollector(plugins))

    def watch_token_producer(self, stats: TokenizerStats) -> None:
        """Report the token producer's tokenized requests and fallbacks at scrape time."""
        self.registry.register(TokenProducerCollector(stats))

    gather: Callable[[], Awaitable[None]] | None = None
    """Awaited before each read of the page: under --workers, the workers'
    stream-side series come in (`Owner.gather`)."""

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


Authorize = Callable[[str | None, str], Awaitable[int]]
"""(Authorization header, path) -> HTTP status: 200 lets the scrape through
(`epp.k8s.metrics_auth.MetricsAuthorizer.check` is one)."""


async def serve_metrics(
    metrics: EppMetrics, host: str, port: int, authorize: Authorize | None = None
) -> tuple[web.AppRunner, int]:
    """Serve `/metrics` on `host:port` (0 picks a free port) in this event
    loop, so scrapes read the core without locks; with `authorize`, only to
    requests it answers 200. Returns the runner (call `cleanup()` to stop)
    and the bound port."""

    async def handle(request: web.Request) -> web.Response:
        if authorize is not None:
            status = await authorize(request.headers.get("Authorization"), request.path)
            if status != 200:
                return web.Response(status=status, text=HTTPStatus(status).phrase + "\n")
        if metrics.gather is not None:
            await metrics.gather()
        return web.Response(
            body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]
