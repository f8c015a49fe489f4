"""`epp serve`: the live EPP, run.

`EppServer` starts the pieces `EppParts` builds and wires
(`epp.serve.assembly`: store, core, metrics, admission, the ext_proc
service, the owner, decider or replica): cluster mode or file mode, the
metrics scraper and the producers, the file watcher, the ext_proc, health
and metrics listeners; it serves until told to stop, and shuts down
gracefully.

Where the pool, objectives and endpoints come from:
- files (`--endpoints` given; `epp.serve.file_mode`): `--pool FILE`, `--objectives PATH...`,
  `--endpoints ip:port,...|@FILE`, each reloaded when it changes
  (`epp.serve.filewatch`). Without `--objectives` the objectives shipped with the
  package (copies of config/samples/) are used; without `--pool`, a pool
  named `--pool-name` in `--pool-namespace` with no labels, or, when neither
  `--pool-name` nor `--objectives` is given, the sample pool the sample
  objectives are written for;
- the cluster (`--pool-name` without `--endpoints`): the pool, the
  namespace's objectives and the pool's pods from the API server
  (`epp.k8s.cluster`).
`--config-file` (also reloaded) gives flow control and scheduling. A file
change that does not load is refused and the last good state stays; queued
requests are never dropped by a reload.

Readiness (gRPC health) turns SERVING once the inputs are loaded (files) or
synced (cluster). On SIGTERM or SIGINT the drain window of `--drain-timeout`
begins, as the reference's: readiness NOT_SERVING; the ext_proc port keeps
accepting connections and streams for the whole window, because a gateway
keeps sending until it sees the readiness change and answers 500 for a
refused connection; new requests get 503 rejected-shutting-down, queued ones
are still dispatched and running ones finish. At its end (or at a second
signal) what is still queued gets rejected-shutting-down, connections get
GOAWAY and what is still open is closed; then everything stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
from pathlib import Path

from epp.api.manifests import ManifestError
from epp.api.registry import ObjectiveRegistry
from epp.datalayer.scraper import MetricsScraper
from epp.extproc.server import PROCESS_METHOD
from epp.serve.assembly import EppParts
from epp.serve.command import settle_heap
from epp.serve.decider import follow_lease
from epp.serve.inputs import StartupError, scrape_settings
from epp.serve.metrics import Authorize, serve_metrics
from epp.serve.metrics.collectors import TransportCounts
from epp.serve.options import ServeOptions
from epp.serve.producers import (
    SCRAPE_TIMEOUT,
    models_scraper,
    start_kv_events,
    start_token_producer,
    tokenizes,
)
from epp.serve.replicas import advertised_host
from epp.serve.scrapes import ScrapeSettings, ScrapeShares
from epp.transport import HEALTH_LIMITS, GrpcServer

log = logging.getLogger("epp.serve.server")

FINAL_FLUSH_S = 1.0
"""After the drain window: how long the last replies (the queue's
rejections) get to be written before the connections are closed."""


class EppServer(EppParts):
    """One live EPP; `start()`, then `stop()` (graceful). See the module docstring."""

    def __init__(self, options: ServeOptions) -> None:
        EppParts.__init__(self, options)
        self._health_updates: set[asyncio.Task[None]] = set()
        self.ports: dict[str, int] = {}
        self._stack = contextlib.AsyncExitStack()
        self._ext_proc_server: GrpcServer | None = None
        self._health_server: GrpcServer | None = None
        self._ready_task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    # -- running -----------------------------------------------------------------

    async def start(self) -> None:
        options = self.options
        await self.health.start()
        if options.cluster:
            await self._start_cluster_mode()
        else:
            await self.health.set_ready()
        scraping = scrape_settings(self.config.data_layer)
        if scraping is None:
            log.warning("no metrics-data-source: model-server metrics are not read")
        elif self.owner is not None:
            self._scrape_settings = ScrapeSettings(
                scraping[0],
                scraping[1],
                options.refresh_metrics_interval,
                SCRAPE_TIMEOUT,
            )
            shares = self.owner.scrapes = ScrapeShares(self.store)
            self.metrics.watch_scrapes(lambda: shares.failures_by_reason)
        else:
            scraper = MetricsScraper(
                self.store,
                self.admission.poke,
                interval=options.refresh_metrics_interval,
                timeout=SCRAPE_TIMEOUT,
                source=scraping[0],
                engines=scraping[1],
            )
            await self._stack.enter_async_context(scraper)
            self.metrics.watch_scrapes(lambda: scraper.failures_by_reason)
        await self._start_producers()
        self.watch_files()
        self.watcher.start()
        self._stack.push_async_callback(self.watcher.stop)
        await self._start_servers()
        self._announce()
        settle_heap()

    async def _start_producers(self) -> None:
        config, stack = self.config, self._stack
        subscribers = await start_kv_events(stack, config, self.core, self.store)
        if subscribers is not None:
            self.kv_subscribers = subscribers
            self.metrics.watch_kv_cache(lambda: self.core.kv_index, subscribers.stats)
        producer = await start_token_producer(
            stack,
            config,
            self.plugin_durations,
            self.options.token_cache_limits(),
            workers=self.owner is not None,
            current=lambda: self.config,
        )
        if producer is not None:
            self.service.tokenize = producer.tokenize
            self.token_producer = producer
            self.metrics.watch_token_producer(producer.stats)
        elif self.owner is not None and tokenizes(config):
            self.metrics.watch_token_producer(self.owner.tokenizer)  # the workers'
        if config.models is not None:
            scraper = models_scraper(
                self.store, self.model_lists, config.models, self.options.refresh_metrics_interval
            )
            await stack.enter_async_context(scraper)

    async def _start_cluster_mode(self) -> None:
        from epp.k8s.cluster import ClusterSettings, cluster_mode
        from epp.k8s.leader import LeaseSettings

        options = self.options
        assert options.served_pool_name is not None
        mode = await self._stack.enter_async_context(
            cluster_mode(
                ClusterSettings(
                    options.served_pool_name,
                    options.namespace,
                    leader_election=options.ha_enable_leader_election,
                    lease=LeaseSettings(
                        options.ha_lease_duration,
                        options.ha_renew_deadline,
                        options.ha_retry_period,
                    ),
                    endpoint_selector=options.endpoint_selector,
                    target_ports=options.endpoint_target_ports,
                ),
                lambda pool: ObjectiveRegistry(pool, publish=self.core.ensure_bands),
                self.store,
                kube_config=options.kubeconfig,
            )
        )

        async def ready_when_synced() -> None:
            await mode.ready.wait()
            await self.health.set_ready()

        def leadership(leading: bool) -> None:
            task = asyncio.get_running_loop().create_task(self.health.set_leading(leading))
            self._health_updates.add(task)
            task.add_done_callback(self._health_updates.discard)

        mode.leadership_listeners.append(leadership)
        leadership(mode.is_leader)

        self._mode = mode
        self._ready_task = asyncio.create_task(ready_when_synced(), name="cluster readiness")

    async def _start_servers(self) -> None:
        options = self.options
        address = options.bind_address
        servers: dict[str, TransportCounts] = {}
        if self.owner is not None:
            self.owner.publish_endpoints(self._addresses())
            self.ports["grpc"] = await self.owner.start(address, options.grpc_port)
            servers["grpc"] = self.owner.transport
        else:
            self._ext_proc_server = servers["grpc"] = GrpcServer(
                {PROCESS_METHOD: self.service.open, **self.health.routes()},
                limits=self._ext_proc_limits(),
            )
            self.ports["grpc"] = await self._ext_proc_server.start(
                address, options.grpc_port, self._ssl_context
            )
        if self.decider is not None:
            assert options.decider_port is not None
            port = self.ports["decider"] = await self.decider.start(
                address, options.decider_port, leading=self._mode is None
            )
            if self._mode is not None:
                replica = self.replica
                follow_lease(
                    self.decider,
                    self._mode,
                    f"{advertised_host(address)}:{port}",
                    (lambda: (replica.told_epoch, replica.told)) if replica is not None else None,
                )
        if self.replica is not None:
            self.replica.start()
        self._health_server = servers["grpc_health"] = GrpcServer(
            self.health.routes(), limits=HEALTH_LIMITS
        )
        self.ports["grpc_health"] = await self._health_server.start(
            address, options.grpc_health_port
        )
        self.metrics.watch_transport(servers)

        runner, self.ports["metrics"] = await serve_metrics(
            self.metrics, address, options.metrics_port, self._metrics_authorizer()
        )
        self._stack.push_async_callback(runner.cleanup)

    def _metrics_authorizer(self) -> Authorize | None:
        """Bearer tokens checked with the API server in cluster mode
        (`--metrics-endpoint-auth`); /metrics is open in file mode."""
        if self._mode is None or not self.options.metrics_endpoint_auth:
            return None
        from epp.k8s.metrics_auth import MetricsAuthorizer

        return MetricsAuthorizer(self._mode.api_client).check

    def _announce(self) -> None:
        ports = self.ports
        log.info(
            "epp serving: ext_proc port %d (%s), grpc health port %d, metrics port %d (%s), "
            "%s mode, pid %d",
            ports["grpc"],
            "tls" if self._ssl_context is not None else "plaintext",
            ports["grpc_health"],
            ports["metrics"],
            "bearer token"
            if self._mode is not None and self.options.metrics_endpoint_auth
            else "open",
            "cluster" if self.options.cluster else "file",
            os.getpid(),
        )
        if self.options.ready_file is not None:
            path = Path(self.options.ready_file)
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(json.dumps({**ports, "pid": os.getpid()}))
            temporary.replace(path)

    def hurry(self) -> None:
        """End the drain window now (a second signal)."""
        self._hurry.set()

    async def stop(self) -> None:
        """Graceful: the drain window, then the end; see the module docstring."""
        loop = asyncio.get_running_loop()
        window = self.options.drain_timeout
        deadline = loop.time() + window
        gc.unfreeze()
        await self.health.shutting_down()
        if self.decider is not None:
            # the replicas admit within their shares meanwhile, not this drain's 503s
            self.decider.resign()
            if self._mode is not None:
                # the next holder decides now, not a lease duration later
                await self._mode.step_down()
        log.info(
            "shutting down: %d queued, %d in flight; new requests get 503 "
            "rejected-shutting-down for the %.1f s drain window",
            self.admission.queued,
            self.admission.in_flight,
            window,
        )
        hurried = asyncio.ensure_future(self._hurry.wait())
        draining = asyncio.ensure_future(self.admission.shutdown(window))
        await asyncio.wait([hurried, draining], return_when=asyncio.FIRST_COMPLETED)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hurried, max(0.0, deadline - loop.time()))
        if not draining.done():
            draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await draining
            await self.admission.shutdown(0.0)
        log.info("drain window over: %d requests still in flight", self.admission.in_flight)
        if self._ext_proc_server is not None:
            await self._ext_proc_server.stop(FINAL_FLUSH_S)
        if self.owner is not None:
            await self.owner.stop()
        if self.decider is not None:
            await self.decider.stop()
        if self.replica is not None:
            await self.replica.stop()
        if self._health_server is not None:
            await self._health_server.stop(None)
        if self._ready_task is not None:
            self._ready_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ready_task
        await self._stack.aclose()
        log.info("stopped")


async def serve(options: ServeOptions) -> int:
    """Run until SIGTERM or SIGINT; 0 after a clean shutdown, 2 when the
    inputs cannot start an EPP."""
    try:
        server = EppServer(options)
    except (StartupError, ManifestError, ValueError, OSError) as error:
        log.error("cannot start: %s", error)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            server.hurry()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        await server.start()
    except (StartupError, OSError) as error:
        log.error("cannot start: %s", error)
        server.hurry()  # nothing was admitted: no drain window
        await server.stop()
        return 2
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0
