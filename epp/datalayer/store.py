"""The endpoint store: the one owner of the pool's endpoints and their metrics.

Sources (pod watch, static list, the simulator's servers going up and down)
add, update and remove endpoints; the scraper (live) or the simulator
(`epp.sim.engine`) writes metrics. Readers take a `PoolSnapshot`, an
immutable tuple rebuilt only on the first read after a change, so taking one
costs nothing while nothing changed. The store does no I/O, so the simulator
uses it as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from epp.datalayer.endpoints import EndpointSpec
from epp.scheduling.endpoint import EMPTY_POOL, Endpoint, EndpointMetrics, PoolSnapshot


class EndpointStore:
    """Endpoints by address, with metrics; see the module docstring.

    Listeners added with `on_membership_change` are called (synchronously,
    without arguments) whenever endpoints join or leave.
    """

    __slots__ = ("_dirty", "_endpoints", "_listeners", "_membership", "_snapshot", "_version")

    def __init__(self, specs: Iterable[EndpointSpec] = ()) -> None:
        self._endpoints: dict[str, Endpoint] = {}
        self._listeners: list[Callable[[], None]] = []
        self._snapshot = EMPTY_POOL
        self._version = 0
        self._membership = 0
        self._dirty = False
        self.replace_all(specs)

    def on_membership_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def snapshot(self) -> PoolSnapshot:
        """The pool now (the same object until something changes)."""
        if self._dirty:
            self._snapshot = PoolSnapshot(
                endpoints=tuple(self._endpoints.values()),
                version=self._version,
                membership=self._membership,
            )
            self._dirty = False
        return self._snapshot

    def get(self, address: str) -> Endpoint | None:
        return self._endpoints.get(address)

    def addresses(self) -> list[str]:
        return list(self._endpoints)

    def __len__(self) -> int:
        return len(self._endpoints)

    def upsert(self, spec: EndpointSpec) -> bool:
        """Add the endpoint, or update its name and labels (keeping its
        metrics). Returns whether anything changed."""
        current = self._endpoints.get(spec.address)
        if current is None:
            self._endpoints[spec.address] = Endpoint(
                spec.name, spec.address, dict(spec.labels), id=spec.id
            )
            self._changed(membership=True)
            self._notify()
            return True
        if _same(current, spec):
            return False
        self._endpoints[spec.address] = Endpoint(
            spec.name, spec.address, dict(spec.labels), current.metrics, spec.id
        )
        self._changed(membership=False)
        return True

    def remove(self, address: str) -> bool:
        """Remove the endpoint at `address`; returns whether it was there."""
        if self._endpoints.pop(address, None) is None:
            return False
        self._changed(membership=True)
        self._notify()
        return True

    def replace_all(self, specs: Iterable[EndpointSpec]) -> bool:
        """Make the pool exactly `specs`, in their order (a full resync from a
        source); endpoints that stay keep their metrics. Returns whether
        anything changed."""
        wanted = {spec.address: spec for spec in specs}
        gone = [address for address in self._endpoints if address not in wanted]
        joined = [address for address in wanted if address not in self._endpoints]
        changed = False
        for address in gone:
            del self._endpoints[address]
        for spec in wanted.values():
            current = self._endpoints.get(spec.address)
            if current is None or not _same(current, spec):
                metrics = current.metrics if current is not None else EndpointMetrics()
                self._endpoints[spec.address] = Endpoint(
                    spec.name, spec.address, dict(spec.labels), metrics, spec.id
                )
                changed = True
        if gone or joined:
            if joined:
                self._endpoints = {address: self._endpoints[address] for address in wanted}
            self._changed(membership=True)
            self._notify()
            return True
        if changed:
            self._changed(membership=False)
        return changed

    def set_metrics(self, address: str, metrics: EndpointMetrics) -> bool:
        """Record fresh metrics for `address` (ignored if it left the pool).
        Returns whether any value differs from the previous read, or the
        endpoint had no good read before."""
        current = self._endpoints.get(address)
        if current is None:
            return False
        previous = current.metrics
        self._endpoints[address] = current.with_metrics(metrics)
        self._changed(membership=False)
        return previous.updated_at is None or not previous.same_values(metrics)

    def set_all_metrics(
        self, addresses: Iterable[str], readings: Iterable[EndpointMetrics]
    ) -> None:
        """`set_metrics` for endpoints read together (the simulator's scrape
        of its whole pool), one change for all: what a reader sees is the
        same, as none reads in between, at a call per scrape rather than
        several per endpoint (`bench.instructions`)."""
        endpoints = self._endpoints
        changed = False
        for address, metrics in zip(addresses, readings):  # noqa: B905 (a keyword parse per call)
            current = endpoints.get(address)
            if current is not None:
                endpoints[address] = current.with_metrics(metrics)
                changed = True
        if changed:
            self._changed(membership=False)

    def mark_failing(self, address: str) -> bool:
        """The latest read of `address` failed: its metrics turn stale at once
        (the last values stay). Returns whether it was not failing before."""
        current = self._endpoints.get(address)
        if current is None or current.metrics.failing:
            return False
        self._endpoints[address] = current.with_metrics(current.metrics._replace(failing=True))
        self._changed(membership=False)
        return True

    def _changed(self, membership: bool) -> None:
        self._version += 1
        if membership:
            self._membership += 1
        self._dirty = True

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()


def _same(endpoint: Endpoint, spec: EndpointSpec) -> bool:
    """Whether `spec` describes `endpoint` as it is (name, labels, identity)."""
    return (
        endpoint.name == spec.name
        and endpoint.labels == spec.labels
        and endpoint.id == (spec.id or spec.name)
    )
