"""The pieces of one live EPP, built and wired: `EppParts`.

From the options and the configuration: the endpoint store, the core
(`build_core`), the metrics and what they watch, the admission controller,
the ext_proc service, and under `--workers`, `--decider-port` or
`--decider` the owner, the decider or the replica; and the reloads of the
configuration, the certificate and the input files. Nothing listens yet:
`epp.serve.server.EppServer` starts, serves and drains them.

    EndpointStore --snapshot--> Core (build_core: gate + Scheduler + FlowController,
        |                            ^  evictor, prefill deadlines, admitters;
        |                            |  epp.scheduling.core)
        +--> MetricsScraper --poke--> AdmissionController  <-- ObjectiveRegistry
                                             |                (priorities -> bands)
                                        EppMetrics
                                             |
                     ExtProcService + Health (epp.transport, port 9002); Health (9003)
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from epp.config.datalayer import FileDiscovery
from epp.config.loader import EppConfig
from epp.datalayer.models import ModelLists
from epp.datalayer.store import EndpointStore
from epp.extproc.openai import engine_priority_on
from epp.extproc.parsers import parser_set
from epp.extproc.server import ExtProcService
from epp.extproc.stream import StreamSettings
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.core import build_core
from epp.scheduling.sessions import bindings_of
from epp.serve.admission import AdmissionController
from epp.serve.configuration import live_part, load_serve_config
from epp.serve.decider import Decider, lease_decider
from epp.serve.file_mode import FileMode
from epp.serve.filewatch import FileWatcher
from epp.serve.health import Health
from epp.serve.inputs import with_file_discovery
from epp.serve.metrics import (
    SCHEDULER_BUCKETS,
    EppMetrics,
    PluginDurations,
    Tally,
    TimedPlacer,
)
from epp.serve.options import ServeOptions
from epp.serve.owner import Owner
from epp.serve.producers import token_producer_key
from epp.serve.replica import Relay, ReplicaAdmission
from epp.serve.replicas import endpoint_limit
from epp.serve.scrapes import ScrapeSettings
from epp.serve.views import PoolViews
from epp.serve.worker import WorkerSpec
from epp.transport import TransportLimits

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


def at_end_of_turn(callback: Callable[..., None]) -> Callable[..., None]:
    """`callback`, run at the end of the event loop's current turn instead of
    at once: after the replies of the turn are written, off the latency of
    the request that set it off (for metrics)."""

    def deferred(*args: object) -> None:
        asyncio.get_running_loop().call_soon(callback, *args)

    return deferred


def decided_then(
    decided: Callable[[FlowRequest, float], bool], then: Callable[[FlowRequest, float], None]
) -> Callable[[FlowRequest, float], None]:
    """An `on_outcome` telling a worker its request's decision, then `then`
    unless the worker records the outcome (`decided` says so)."""

    def on_outcome(request: FlowRequest, now: float) -> None:
        if not decided(request, now):
            then(request, now)

    return on_outcome


class EppParts:
    """The pieces of one live EPP, built from its options and configuration
    and wired to each other, and their reloads; `EppServer` runs them."""

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
        self.watcher = FileWatcher(options.file_watch_interval)
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
        forwards = options.decider is not None or (
            options.cluster and options.decider_port is not None
        )
        self.owner: Owner | None = None
        if options.workers:
            self.metrics.streams_here = False
            owner = self.owner = Owner(
                options.workers,
                self._worker_spec,
                self.priority_of,
                self.metrics.merge(self.plugin_durations.family),  # the token producer's
                # a forwarding replica records no outcome series: its decider does
                outcomes=None if forwards else self.metrics,
            )
            self.metrics.gather = owner.gather
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
            on_outcome = decided_then(self.decider.decided, on_outcome)
        self.replica: ReplicaAdmission | None = None
        if forwards:
            self.replica = ReplicaAdmission(
                options.replica_id or socket.gethostname(),
                options.decider or (lambda: lease_decider(self._mode)),
                options.replicas,
                self._addresses,
                limit_of,
                self._rng.randrange(1 << 63),
                flow_control=lambda: self.config.flow_control,
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
            owner.admission = (
                self.admission if self.replica is None else Relay(self.replica, self.core, owner)
            )
            self.core.on_evict = owner.evict
            self.health.on_change.append(owner.publish_health)
            self.store.on_membership_change(lambda: owner.publish_endpoints(self._addresses()))
            if self.config.models is not None:
                lists = self.model_lists
                lists.on_change = lambda: owner.publish_models(lists.answer())
                self.store.on_membership_change(lists.on_change)
            self.metrics.watch_workers(owner.counts)
        if self.decider is not None:
            replicas = self.decider.owner
            replicas.admission = self.admission
            owner = self.owner
            self.core.on_evict = lambda request: (
                replicas.evict(request),
                owner.evict(request) if owner is not None else self.service.evict(request),
            )
        self.settings = StreamSettings(
            max_body_bytes=options.max_body_bytes,
            honour_subset=not options.disable_endpoint_subset_filter,
            default_model=options.default_model,
            parsers=parser_set(self.config.parsers),
            any_endpoint=self.any_endpoint,
            chunk_gaps=self.metrics.chunk_gaps,
            priority_in_body=self._priority_in_body(self.config),
            models=self.model_lists.answer if self.config.models is not None else None,
        )
        if self.owner is not None:
            self.owner.priority_in_body = self._owner_priority_in_body()
        self.service = ExtProcService(
            self.replica or self.admission,
            self.priority_of,
            self.settings,
            listener=self.metrics.on_stream_event,
            screen=self.admission.screen if self.replica is None else None,
            on_response_processed=self.metrics.on_response_processed,
        )
        if self.replica is not None and self.owner is None:
            self.replica.on_evict = self.service.evict
        linked = [side.stats for side in (self.replica, self.decider) if side is not None]
        if linked:
            self.metrics.watch_replicas(*linked)

    def _owner_priority_in_body(self) -> Callable[[FlowRequest], int | None] | None:
        """What the owner's DECISIONs carry as the forwarded body's priority:
        in a forwarding replica, what the decider's gave."""
        if self.replica is not None:
            return self.replica.priority_in_body
        return self.settings.priority_in_body

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
            self.metrics.pool_name,
            models_responder=self.config.models is not None,
            propagate_priority=self.config.propagate_priority,
            tokenizer=self.config.tokenizer,
            tokenizer_key=token_producer_key(self.config) if self.config.tokenizer else None,
            precise=self.config.scheduling.precise,
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
                priority_in_body=self._priority_in_body(new),
            )
            self.service.settings = self.settings
            if self.owner is not None:
                self.owner.priority_in_body = self._owner_priority_in_body()
        self.config = new
        self.admission.reload(
            new.flow_control,
            scheduling=new.scheduling if rescheduled else None,
            rng=random.Random(self._rng.randrange(1 << 63)) if rescheduled else None,
            admitters=new.flow_plugins.admitters,
        )
        if rescheduled:
            self.metrics.watch_scheduling(new.scheduling.handler)

    def _priority_in_body(self, config: EppConfig) -> Callable[[FlowRequest], int] | None:
        """The forwarded body's priority when the configuration propagates it."""
        return engine_priority_on(self.endpoint_labels) if config.propagate_priority else None

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
