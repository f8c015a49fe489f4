"""Pods of the pool as endpoints, and the sink that receives them.

A pod is an endpoint while it has an IP, its `Ready` condition is True and it
is not being deleted (no `deletionTimestamp`): a terminating pod stops taking
new requests at once, even while its containers still report ready. A pod
contributes one endpoint per target port of the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from epp.api.models import InferencePool
from epp.datalayer.endpoints import EndpointSpec, pod_endpoints


class EndpointSink(Protocol):
    """Where pod endpoints go (`epp.datalayer.store.EndpointStore` is one)."""

    def upsert(self, spec: EndpointSpec) -> bool: ...

    def remove(self, address: str) -> bool: ...

    def replace_all(self, specs: Iterable[EndpointSpec]) -> bool: ...


def is_serving(pod: Mapping[str, Any]) -> bool:
    """Whether the pod should receive requests now."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if metadata.get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or ()
    )


def endpoints_of(pod: Mapping[str, Any], pool: InferencePool) -> list[EndpointSpec]:
    """The endpoints `pod` contributes to `pool` now (none unless serving)."""
    if not is_serving(pod) or not pool.target_ports:
        return []
    metadata = pod["metadata"]
    return pod_endpoints(
        metadata["name"],
        pod["status"]["podIP"],
        metadata.get("labels") or {},
        pool.target_ports,
        metadata.get("namespace") or pool.namespace,
    )


def label_selector(pool: InferencePool) -> str:
    """The pool's pod selector in the API server's query syntax."""
    return ",".join(f"{key}={value}" for key, value in sorted(pool.selector.items()))


class PodEndpoints:
    """Keeps the sink equal to the endpoints of the pods seen so far (a
    reflector handler: `replace` on a list, `event` on a watch event).

    Pods are tracked by name, so an update that changes a pod's IP, labels or
    readiness replaces exactly that pod's endpoints."""

    __slots__ = ("_addresses", "_pods", "_pool", "_sink")

    def __init__(self, sink: EndpointSink, pool: InferencePool) -> None:
        self._sink = sink
        self._pool = pool
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._addresses: dict[str, list[str]] = {}

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full list: the pods are exactly these now."""
        self._pods = {pod["metadata"]["name"]: pod for pod in pods}
        self._publish_all()

    def set_pool(self, pool: InferencePool) -> None:
        """The pool changed (target ports): recompute every pod's endpoints."""
        if pool.target_ports != self._pool.target_ports:
            self._pool = pool
            self._publish_all()
        self._pool = pool

    def event(self, kind: str, pod: Mapping[str, Any]) -> None:
        """One watch event (the reflector's handler interface)."""
        if kind == "DELETED":
            self.delete(pod)
        else:
            self.upsert(pod)

    def upsert(self, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self._pods[name] = pod
        specs = endpoints_of(pod, self._pool)
        wanted = [spec.address for spec in specs]
        for address in self._addresses.get(name, ()):
            if address not in wanted:
                self._sink.remove(address)
        for spec in specs:
            self._sink.upsert(spec)
        self._addresses[name] = wanted

    def delete(self, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self._pods.pop(name, None)
        for address in self._addresses.pop(name, ()):
            self._sink.remove(address)

    def _publish_all(self) -> None:
        specs: list[EndpointSpec] = []
        self._addresses = {}
        for name, pod in self._pods.items():
            pod_specs = endpoints_of(pod, self._pool)
            self._addresses[name] = [spec.address for spec in pod_specs]
            specs.extend(pod_specs)
        self._sink.replace_all(specs)
