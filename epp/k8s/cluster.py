"""Cluster mode: the EPP follows its InferencePool, the namespace's
InferenceObjectives and the pool's pods, and (as leader) reports status.

`cluster_mode(...)` is the entry point `epp serve --pool-name` uses. It feeds
two things it does not own: the ObjectiveRegistry (made by `registry_factory`
once the pool is first seen, since a registry needs its pool) and an endpoint
sink (the datalayer's EndpointStore). `ready` is set after the first complete
list of all three kinds; ext_proc serves on every replica, and only the
leader of the pool's Lease writes status (and, told through
`leadership_listeners`, the server reports ready only there).

Pool-less (`--endpoint-selector` with `--endpoint-target-ports`, as the
reference's standalone mode): no InferencePool and no InferenceObjectives are
read (every request has priority 0); the pods matching the selector, in the
namespace, are the endpoints, one per target port. The pool is named after the
EPP's Deployment (from `$POD_NAME`), as the reference names it. `ready` is set
after the first list of pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import config as kube_config_loader
from kubernetes_asyncio.client import (
    ApiClient,
    Configuration,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
)

from epp.api.models import POOL_GROUP, InferencePool, InvalidObjectError, decode
from epp.api.registry import ObjectiveRegistry
from epp.datalayer.polling import cancel_and_wait
from epp.k8s.leader import LeaderElector, LeaseSettings, lease_name
from epp.k8s.objectives import GROUP, PLURAL, READ_VERSION, ObjectiveSource
from epp.k8s.pods import EndpointSink, PodEndpoints, label_selector
from epp.k8s.reflector import Handler, Reflector, WatchSettings
from epp.k8s.status_writer import StatusWriter

log = logging.getLogger(__name__)

POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"


def default_identity() -> str:
    """This replica's name in the Lease: the pod name when known."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


@dataclass(slots=True, frozen=True)
class ClusterSettings:
    pool_name: str
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    leader_election: bool = True
    """Without it this replica writes status unconditionally (one replica only)."""
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    status_retry: float = 1.0
    endpoint_selector: str | None = None
    """Pool-less: the pods' label selector (API server syntax), in lieu of the pool."""
    target_ports: tuple[int, ...] = ()
    """Pool-less: the pods' ports."""

    @property
    def pool_less(self) -> bool:
        return self.endpoint_selector is not None


class ClusterMode:
    """See the module docstring. `start()` once, `stop()` once."""

    def __init__(
        self,
        settings: ClusterSettings,
        api_client: ApiClient,
        registry_factory: Callable[[InferencePool], ObjectiveRegistry],
        endpoints: EndpointSink,
    ) -> None:
        self.settings = settings
        self.api_client = api_client
        self.ready = asyncio.Event()
        self.pool: InferencePool | None = None
        self.registry: ObjectiveRegistry | None = None
        self._registry_factory = registry_factory
        self._endpoints = endpoints
        self._pods: PodEndpoints | None = None
        self._pods_synced = False
        self._objectives_done = False
        self._tasks: list[asyncio.Task[None]] = []
        self._pod_task: asyncio.Task[None] | None = None
        custom = CustomObjectsApi(api_client)
        self._core = CoreV1Api(api_client)
        self.objectives = ObjectiveSource(on_change=lambda name: self.status.mark([name]))
        self.status = StatusWriter(
            custom,
            settings.namespace,
            objects=lambda: self.objectives.raw,
            applies=self._applies,
            retry_delay=settings.status_retry,
        )
        self.objective_reflector = Reflector(
            f"InferenceObjectives {GROUP}/{READ_VERSION} in {settings.namespace}",
            custom.list_namespaced_custom_object,
            _Synced(self.objectives, self._objectives_synced),
            settings.watch,
            group=GROUP,
            version=READ_VERSION,
            namespace=settings.namespace,
            plural=PLURAL,
        )
        self.pool_reflector = Reflector(
            f"InferencePool {settings.namespace}/{settings.pool_name}",
            custom.list_namespaced_custom_object,
            _PoolHandler(self),
            settings.watch,
            group=POOL_GROUP,
            version=POOL_VERSION,
            namespace=settings.namespace,
            plural=POOL_PLURAL,
            field_selector=f"metadata.name={settings.pool_name}",
        )
        self.pod_reflector: Reflector | None = None
        self.leadership_listeners: list[Callable[[bool], None]] = []
        """Told of every change of this replica's leadership (with leader election)."""
        self.elector: LeaderElector | None = None
        if settings.leader_election:
            self.elector = LeaderElector(
                CoordinationV1Api(api_client),
                lease_name(settings.namespace, settings.pool_name),
                settings.namespace,
                settings.identity,
                settings.lease,
                on_change=self._leader_changed,
            )

    def _leader_changed(self, leading: bool) -> None:
        self.status.set_enabled(leading)
        for listener in self.leadership_listeners:
            listener(leading)

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else True

    async def start(self) -> None:
        if self.settings.pool_less:
            self._start_pool_less()
            return
        log.info(
            "reading InferenceObjectives through %s/%s, the storage version "
            "(v1 would prune the poolRef of objectives written in v1alpha2)",
            GROUP,
            READ_VERSION,
        )
        self._spawn(self.objective_reflector.run())
        self._spawn(self.pool_reflector.run())
        self._spawn(self.status.run())
        if self.elector is not None:
            self._spawn(self.elector.run())
        else:
            self.status.set_enabled(True)

    async def step_down(self) -> None:
        """Release the Lease now if held and compete for it no more (a
        decider that drains); the watches go on."""
        if self.elector is not None:
            await self.elector.step_down()

    async def stop(self) -> None:
        """Stop watching, then release the Lease if held."""
        tasks = [*self._tasks, *([self._pod_task] if self._pod_task else [])]
        await cancel_and_wait(tasks)
        self._tasks.clear()
        self._pod_task = None
        if self.elector is not None:
            await self.elector.release()

    def _start_pool_less(self) -> None:
        settings = self.settings
        assert settings.endpoint_selector is not None
        pool = InferencePool(
            settings.pool_name, settings.namespace, target_ports=settings.target_ports
        )
        self.pool = pool
        self.registry = self._registry_factory(pool)
        self._objectives_done = True
        self._watch_pods(pool, settings.endpoint_selector)
        if self.elector is not None:
            self._spawn(self.elector.run())

    # -- pool ------------------------------------------------------------------

    def pool_seen(self, obj: dict[str, Any]) -> None:
        try:
            pool = decode(obj, strict=False)
        except InvalidObjectError as error:
            log.error(
                "InferencePool %s refused, keeping the last good version: %s",
                self.settings.pool_name,
                error,
            )
            return
        assert isinstance(pool, InferencePool)
        previous, self.pool = self.pool, pool
        if self.registry is None:
            self.registry = self._registry_factory(pool)
            self.objectives.attach(self.registry)
        else:
            self.registry.set_pool(pool)
        if previous is None or previous.selector != pool.selector or self._pods is None:
            self._watch_pods(pool, label_selector(pool))
        else:
            self._pods.set_pool(pool)
        self.status.mark_all()
        self._check_ready()

    def pool_gone(self) -> None:
        """The pool was deleted: no endpoints until it comes back."""
        if self.pool is not None:
            log.warning(
                "InferencePool %s/%s is gone; the pool has no endpoints",
                self.settings.namespace,
                self.settings.pool_name,
            )
        self.pool = None
        self._stop_pod_watch()
        self._endpoints.replace_all([])

    # -- pods ------------------------------------------------------------------

    def _watch_pods(self, pool: InferencePool, selector: str) -> None:
        self._stop_pod_watch()
        log.info("watching pods of %s/%s with selector %r", pool.namespace, pool.name, selector)
        self._pods = PodEndpoints(self._endpoints, pool)
        self.pod_reflector = Reflector(
            f"pods {selector} in {pool.namespace}",
            self._core.list_namespaced_pod,
            _Synced(self._pods, self._pods_listed),
            self.settings.watch,
            namespace=pool.namespace,
            label_selector=selector,
        )
        self._pod_task = asyncio.create_task(self.pod_reflector.run())

    def _stop_pod_watch(self) -> None:
        if self._pod_task is not None:
            self._pod_task.cancel()
            self._pod_task = None
        self._pods = None

    # -- readiness ---------------------------------------------------------------

    def _objectives_synced(self) -> None:
        self._objectives_done = True
        self._check_ready()

    def _pods_listed(self) -> None:
        self._pods_synced = True
        self._check_ready()

    def _check_ready(self) -> None:
        if self.ready.is_set():
            return
        if self._objectives_done and self.pool is not None and self._pods_synced:
            log.info("cluster state synced: pool, objectives and pods")
            self.ready.set()

    def _applies(self, name: str) -> bool:
        return self.registry is not None and self.registry.get(name) is not None

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coroutine))


class _Synced:
    """A reflector handler that also reports each complete list."""

    def __init__(self, handler: Handler, listed: Callable[[], None]) -> None:
        self._handler = handler
        self._listed = listed

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self._handler.replace(objects)
        self._listed()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self._handler.event(kind, obj)


class _PoolHandler:
    def __init__(self, mode: ClusterMode) -> None:
        self._mode = mode

    def replace(self, objects: list[dict[str, Any]]) -> None:
        if objects:
            self._mode.pool_seen(objects[0])
        else:
            self._mode.pool_gone()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._mode.pool_gone()
        else:
            self._mode.pool_seen(obj)


async def load_api_client(kube_config: str | None = None) -> ApiClient:
    """An API client from `kube_config` if given, else the in-cluster service
    account, else the default kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    configuration = Configuration()
    if kube_config is not None:
        await kube_config_loader.load_kube_config(
            config_file=kube_config, client_configuration=configuration
        )
    else:
        try:
            kube_config_loader.load_incluster_config(client_configuration=configuration)
        except kube_config_loader.ConfigException:
            await kube_config_loader.load_kube_config(client_configuration=configuration)
    return ApiClient(configuration)


@contextlib.asynccontextmanager
async def cluster_mode(
    settings: ClusterSettings,
    registry_factory: Callable[[InferencePool], ObjectiveRegistry],
    endpoints: EndpointSink,
    kube_config: str | None = None,
    api_client: ApiClient | None = None,
) -> AsyncIterator[ClusterMode]:
    """Run cluster mode for the duration of the `async with` block.
    `api_client` overrides `kube_config` (tests pass one)."""
    client = api_client or await load_api_client(kube_config)
    mode = ClusterMode(settings, client, registry_factory, endpoints)
    await mode.start()
    try:
        yield mode
    finally:
        await mode.stop()
        if api_client is None:
            await client.close()
