"""`epp serve`: the composition root of the live EPP.

Builds every piece from the options, serves until told to stop, and shuts
down gracefully:

    EndpointStore --snapshot--> Core (build_core: gate + Scheduler + FlowController,
        |                            ^  evictor, prefill deadlines, admitters;
        |                            |  epp.scheduling.core)
        +--> MetricsScraper --poke--> AdmissionController  <-- ObjectiveRegistry
                                             |                (priorities -> bands)
                                        EppMetrics
                                             |
                     ExtProcService + Health (epp.transport, port 9002); Health (9003)

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
import random
import signal
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.api.manifests import ManifestError
from epp.api.registry import ObjectiveRegistry
from epp.config.datalayer import (
    FileDiscovery,
)
from epp.config.loader import EppConfig
from epp.datalayer.models import ModelLists
from epp.datalayer.scraper import MetricsScraper
from epp.datalayer.store import EndpointStore
from epp.extproc.parsers import parser_set
from epp.extproc.server import PROCESS_METHOD, ExtProcService
from epp.extproc.stream import StreamSettings
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.core import build_core
from epp.scheduling.sessions import bindings_of
from epp.serve.admission import AdmissionController
from epp.serve.configuration import live_part, load_serve_config
from epp.serve.decider import Decider, follow_lease, lease_decider
from epp.serve.file_mode import FileMode
from epp.serve.filewatch import FileWatcher
from epp.serve.health import Health
from epp.serve.inputs import (
    StartupError,
    scrape_settings,
    with_file_discovery,
)
from epp.serve.metrics import (
    SCHEDULER_BUCKETS,
    Authorize,
    EppMetrics,
    PluginDurations,
    Tally,
    TimedPlacer,
    serve_metrics,
)
from epp.serve.metrics.collectors import TransportCounts
from epp.serve.options import ServeOptions
from epp.serve.owner import Owner
from epp.serve.producers import (
    SCRAPE_TIMEOUT,
    models_scraper,
    start_kv_events,
    start_token_producer,
)
from epp.serve.replica import ReplicaAdmission
from epp.serve.replicas import advertised_host, endpoint_limit
from epp.serve.scrapes import ScrapeSettings, ScrapeShares
from epp.serve.views import PoolViews
from epp.serve.worker import WorkerSpec
from epp.transport import HEALTH_LIMITS, GrpcServer, TransportLimits

if TYPE_CHECKING:
    from epp.k8s.cluster import ClusterMode

log = logging.getLogger("epp.serve.server")

GRPC_FRAMING_ALLOWANCE = 1024 * 1024
"""Room over the body limit for the rest of an ext_proc message."""


def _queue_capacity(flow: FlowControlConfig) -> int:
    """Requests the queues can hold, each an open ext_proc stream: the global
    limit, else the configured bands' and the default band's (0 when one is
    unlimited: the transport's default then stands)."""
    if flow.max_requests:
        return flow.max_requests
    bands = (*flow.bands, flow.default_band)
    if any(band.max_requests == 0 for band in bands):
        return 0
    return sum(band.max_requests for band in bands)


FINAL_FLUSH_S = 1.0
"""After the drain window: how long the last replies (the queue's
rejections) get to be written before the connections are closed."""

GC_GEN0_THRESHOLD = 50_000
"""Allocations between young-generation collections once started (default
700): the hot path allocates many short-lived objects and few cycles."""


def at_end_of_turn(callback: Callable[..., None]) -> Callable[..., None]:
    """`callback`, run at the end of the event loop's current turn instead of
    at once: after the replies of the turn are written, off the latency of
    the request that set it off (for metrics)."""

    def deferred(*args: object) -> None:
        asyncio.get_running_loop().call_soon(callback, *args)

    return deferred


def decided_then(
    decided: Callable[[FlowRequest], None], then: Callable[[FlowRequest, float], None]
) -> Callable[[FlowRequest, float], None]:
    """An `on_outcome` telling a worker its request's decision, then `then`."""

    def on_outcome(request: FlowRequest, now: float) -> None:
        decided(request)
        then(request, now)

    return on_outcome


class EppServer:
    """One live EPP; `start()`, then `stop()` (graceful). See the module docstring."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self._mode: ClusterMode | None = None
        self.config = self._load_config()
        discovery = self.config.data_layer.discovery
        if discovery is not None and isinstance(discovery[1], FileDiscovery):
            options = self.options = with_file_discovery(options, discovery[1])
        self.health = Health(
            leader_gated=options.cluster
            and options.ha_enable_leader_election
            and options.decider_port is None  # with a decider every replica serves
        )
        self._health_updates: set[asyncio.Task[None]] = set()
        self.ports: dict[str, int] = {}
        self.watcher = FileWatcher(options.file_watch_interval)
        self._stack = contextlib.AsyncExitStack()
        self._ext_proc_server: GrpcServer | None = None
        self._health_server: GrpcServer | None = None
        self._ready_task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()
        self._ssl_context: ssl.SSLContext | None = None
        self._self_signed: tuple[bytes, bytes] | None = None
        self._scrape_settings: ScrapeSettings | None = None
        """What the workers read the metrics with, under --workers."""
        if options.secure_serving:
            from epp.serve.tls import self_signed_certificate, server_ssl_context

            if options.cert_files is None and options.workers:
                self._self_signed = self_signed_certificate()
            self._ssl_context = server_ssl_context(
                options.cert_files,
                options.tls_min_version,
                options.tls_cipher_suites,
                self._self_signed,
            )
        self.store = EndpointStore()
        self.kv_subscribers: Any = None
        self.token_producer: Any = None
        """The KV-cache event subscribers (`epp.datalayer.kvevents`), once started."""
        self.model_lists = ModelLists(self.store)
        self.scheduler_latency = Tally(SCHEDULER_BUCKETS)
        self.plugin_durations = PluginDurations()
        self._build_core(self.config)
        self.files: FileMode | None = None
        if not options.cluster:
            self.files = FileMode(options, self.store, self.core.ensure_bands)
        pool_name = self.files.pool.name if self.files is not None else options.served_pool_name
        self.metrics = EppMetrics(
            pool_name or "default",
            endpoint_names=self._endpoint_names,
            scheduler_latency=self.scheduler_latency,
            plugin_durations=self.plugin_durations,
        )
        views = PoolViews(self.store, self.core, lambda: self.config.scheduling.saturation)
        self.metrics.watch_core(lambda: self.core.saturation(), views.stage_view())
        self.metrics.watch_pool(self.store.snapshot, options.metrics_staleness_threshold)
        if self.core.adaptive is not None:
            self.metrics.watch_limits(self.core.adaptive)
        self.metrics.watch_credits(views.credits_in_use)
        self.metrics.watch_sessions(lambda: bindings_of(self.core.scheduler.plugins))
        self.metrics.watch_prefix_index(lambda: self.core.scheduler.plugins)
        self.metrics.watch_scheduling(self.config.scheduling.handler)
        self.core.watch_flows(self.metrics.on_flows_collected)
        on_outcome = at_end_of_turn(self.metrics.on_outcome)
        self.owner: Owner | None = None
        if options.workers:
            owner = self.owner = Owner(
                options.workers,
                self._worker_spec,
                self.priority_of,
                self.metrics.on_stream_event,
                self.metrics.on_response_processed,
                self.metrics.chunk_gaps,
            )
            on_outcome = decided_then(owner.decided, on_outcome)
        limit_of = endpoint_limit(self.core, self.config.flow_control.gate)
        self.decider: Decider | None = None
        if options.decider_port is not None:
            self.decider = Decider(
                Owner(0, self._worker_spec, self.priority_of),
                self.priority_of,
                options.replicas,
                limit_of,
                self._addresses,
            )
            on_outcome = decided_then(self.decider.owner.decided, on_outcome)
        self.replica: ReplicaAdmission | None = None
        if options.decider is not None or (options.cluster and options.decider_port is not None):
            self.replica = ReplicaAdmission(
                options.replica_id or socket.gethostname(),
                options.decider or (lambda: lease_decider(self._mode)),
                options.replicas,
                self._addresses,
                limit_of,
                self._rng.randrange(1 << 63),
            )
        self.admission = AdmissionController(
            self.core,
            on_outcome=on_outcome,
            on_complete=self.metrics.on_complete,
            on_queued=self.metrics.on_queued,
            on_cycle=self.metrics.on_dispatch_cycle,
            on_enqueued=self.metrics.on_enqueued,
        )
        self.core.on_evict = lambda request: self.service.evict(request)
        self.store.on_membership_change(self.admission.poke)
        if self.owner is not None:
            owner = self.owner
            owner.admission = self.admission
            self.core.on_evict = owner.evict
            self.health.on_change.append(owner.publish_health)
            self.store.on_membership_change(lambda: owner.publish_endpoints(self._addresses()))
            self.metrics.watch_workers(owner.counts)
        if self.decider is not None:
            replicas = self.decider.owner
            replicas.admission = self.admission
            self.core.on_evict = lambda request: (
                replicas.evict(request),
                self.service.evict(request),
            )
        self.settings = StreamSettings(
            max_body_bytes=options.max_body_bytes,
            honour_subset=not options.disable_endpoint_subset_filter,
            default_model=options.default_model,
            parsers=parser_set(self.config.parsers),
            any_endpoint=self.any_endpoint,
            chunk_gaps=self.metrics.chunk_gaps,
            priority_in_body=self.endpoint_labels if self.config.propagate_priority else None,
            models=self.model_lists.answer if self.config.models is not None else None,
        )
        self.service = ExtProcService(
            self.replica or self.admission,
            self.priority_of,
            self.settings,
            listener=self.metrics.on_stream_event,
            screen=self.admission.screen if self.replica is None else None,
            on_response_processed=self.metrics.on_response_processed,
        )
        if self.replica is not None:
            self.replica.on_evict = self.service.evict
            self.metrics.watch_replicas(self.replica.stats)
        if self.decider is not None:
            self.metrics.watch_replicas(self.decider.stats)

    def _addresses(self) -> list[str]:
        return [endpoint.address for endpoint in self.store.snapshot().endpoints]

    def _worker_spec(self, index: int, control_fd: int, handoff_fd: int) -> WorkerSpec:
        return WorkerSpec(
            index,
            control_fd,
            handoff_fd,
            self.options,
            self.config.parsers,
            self._ext_proc_limits(),
            self._rng.randrange(1 << 63),
            self._self_signed,
            self._scrape_settings,
        )

    def _ext_proc_limits(self) -> TransportLimits:
        return self.options.transport_limits().sized_for(
            queued_requests=_queue_capacity(self.config.flow_control),
            reply_bytes=self.settings.max_body_bytes + GRPC_FRAMING_ALLOWANCE,
        )

    # -- building ------------------------------------------------------------

    def _load_config(self) -> EppConfig:
        return load_serve_config(self.options)

    def _build_core(self, config: EppConfig) -> None:
        seed = self.options.seed if self.options.seed is not None else random.randrange(1 << 63)
        self._rng = random.Random(seed + 1)
        self.core = build_core(
            config.flow_control,
            config.scheduling,
            self.store.snapshot,
            time.monotonic,
            random.Random(seed),
            plugin_timer=self.plugin_durations.timed,
            placer_timer=lambda scheduler: TimedPlacer(scheduler, self.scheduler_latency),
            eviction=config.flow_plugins.eviction,
            admitters=config.flow_plugins.admitters,
            admission_rng=self._rng,
        )

    def _endpoint_names(self, address: str) -> tuple[str, str]:
        """(pod name, namespace) of an endpoint, for the scheduler's metrics."""
        endpoint = self.store.get(address)
        mode = self.files if self._mode is None else self._mode
        pool = mode.pool if mode is not None else None
        return (
            endpoint.name if endpoint is not None else "",
            pool.namespace if pool is not None else self.options.namespace,
        )

    def priority_of(self, headers: Mapping[str, str]) -> int:
        """The request's priority from its objective (0 until objectives are known)."""
        mode = self.files if self._mode is None else self._mode
        registry = mode.registry if mode is not None else None
        return registry.resolve(headers).priority if registry is not None else 0

    # -- reloading -------------------------------------------------------------

    def reload_config(self) -> None:
        old = self.config
        new = live_part(old, self._load_config(), self.options.config_file)
        rescheduled = new.scheduling != old.scheduling
        if new.parsers != old.parsers or new.propagate_priority != old.propagate_priority:
            self.settings = replace(
                self.settings,
                parsers=parser_set(new.parsers),
                priority_in_body=self.endpoint_labels if new.propagate_priority else None,
            )
            self.service.settings = self.settings
        self.config = new
        self.admission.reload(
            new.flow_control,
            scheduling=new.scheduling if rescheduled else None,
            rng=random.Random(self._rng.randrange(1 << 63)) if rescheduled else None,
            admitters=new.flow_plugins.admitters,
        )
        if rescheduled:
            self.metrics.watch_scheduling(new.scheduling.handler)

    def endpoint_labels(self, address: str) -> Mapping[str, str]:
        """The labels of the endpoint at `address` (none when it left)."""
        endpoint = self.store.get(address)
        return endpoint.labels if endpoint is not None else {}

    def any_endpoint(self) -> str | None:
        """A random endpoint of the pool (for requests without a body)."""
        endpoints = self.store.snapshot().endpoints
        return self._rng.choice(endpoints).address if endpoints else None

    def reload_certificate(self) -> None:
        assert self._ssl_context is not None and self.options.cert_files is not None
        self._ssl_context.load_cert_chain(*self.options.cert_files)
        log.info("certificate reloaded from %s", self.options.cert_path)

    def watch_files(self) -> None:
        """Register the input files with the watcher (which `start` runs)."""
        options = self.options
        if options.config_file is not None:
            self.watcher.watch("the configuration", [options.config_file], self.reload_config)
        if options.enable_cert_reload and options.cert_files is not None:
            self.watcher.watch("the certificate", options.cert_files, self.reload_certificate)
        if self.files is not None:
            self.files.watch(self.watcher, self.config.data_layer)

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
            settings = self._scrape_settings = ScrapeSettings(
                scraping[0],
                scraping[1],
                options.refresh_metrics_interval,
                SCRAPE_TIMEOUT,
                self.config.scheduling.saturation.staleness,
            )
            shares = self.owner.scrapes = ScrapeShares(self.store, settings.staleness)
            self.metrics.watch_scrapes(lambda: shares.failures_by_reason)
        else:
            scraper = MetricsScraper(
                self.store,
                self.admission.poke,
                interval=options.refresh_metrics_interval,
                timeout=SCRAPE_TIMEOUT,
                staleness=self.config.scheduling.saturation.staleness,
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
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])

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
            workers=self.owner is not None,
            current=lambda: self.config,
        )
        if producer is not None:
            self.service.tokenize = producer.tokenize
            self.token_producer = producer
            self.metrics.watch_token_producer(producer.stats)
        if config.models is not None:
            scraper = models_scraper(
                self.store, self.model_lists, config.models, self.options.refresh_metrics_interval
            )
            await stack.enter_async_context(scraper)

    async def _start_cluster_mode(self) -> None:
        from epp.k8s.cluster import ClusterSettings, cluster_mode

        options = self.options
        assert options.served_pool_name is not None
        mode = await self._stack.enter_async_context(
            cluster_mode(
                ClusterSettings(
                    options.served_pool_name,
                    options.namespace,
                    leader_election=options.ha_enable_leader_election,
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
                follow_lease(self.decider, self._mode, f"{advertised_host(address)}:{port}")
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
