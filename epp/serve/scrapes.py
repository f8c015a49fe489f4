"""Model-server metrics under `epp serve --workers N`: the workers read the
pages, the core owner keeps the store (docs/operations/workers.md).

    owner: ScrapeShares --SCRAPE (a worker's share)--> worker: ScrapeShare
           store <-- record_read / record_failure <-- METRICS, SCRAPE_FAILED
                                                      (one per read worth telling)

Each endpoint is read by one live worker, chosen by rendezvous hashing of
(worker, address): an endpoint joining or leaving moves no other, and a
worker that dies hands only its own endpoints to the others (and takes a
share back when it serves again). Until the new reader's first read, the
endpoint's last values age in the store as any unread endpoint's do, so
the staleness policy judges them; a read from a worker that no longer reads
that endpoint is dropped.

A worker sends a read when its values differ from the last it sent, when
it failed, or when the last one sent is `staleness / 2` old (so the owner's
copy never turns stale while reads succeed, with an idle pool's reads mostly
not sent). The owner writes it into the store as the in-process scraper does
(`epp.datalayer.scraper.record_read`), so the core sees the same snapshots,
and pokes the admission controller once per frame with a read or a new
failure in it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hashlib import blake2b

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.engines import EngineLookup
from epp.datalayer.scraper import MetricsScraper, MetricsSource, record_failure, record_read
from epp.datalayer.store import EndpointStore
from epp.scheduling.endpoint import EndpointMetrics
from epp.serve import wire


@dataclass(slots=True, frozen=True)
class ScrapeSettings:
    """How a worker reads its share (what the in-process scraper is built with)."""

    source: MetricsSource
    engines: EngineLookup
    interval: float
    timeout: float
    staleness: float


def reader_of(address: str, workers: Sequence[int]) -> int:
    """The worker of `workers` that reads `address` (rendezvous hashing)."""
    key = address.encode()
    return max(
        workers, key=lambda index: blake2b(key, digest_size=8, salt=bytes([index % 256])).digest()
    )


class ScrapeShares:
    """The owner's side: who reads which endpoint, and the reads applied to
    the store (see the module docstring)."""

    __slots__ = ("_readers", "_sent", "failures_by_reason", "reads", "store")

    def __init__(self, store: EndpointStore) -> None:
        self.store = store
        self.reads = 0
        """Reads applied to the store."""
        self.failures_by_reason: collections.Counter[str] = collections.Counter()
        self._readers: dict[str, int] = {}
        self._sent: dict[int, list[list[object]]] = {}
        """The share each worker was last sent."""

    def assign(self, live: Sequence[tuple[int, wire.Link]]) -> None:
        """Split the store's endpoints over the `live` (worker, link) pairs;
        a worker whose share changed is sent all of it."""
        workers = [index for index, _ in live]
        shares: dict[int, list[list[object]]] = {index: [] for index in workers}
        readers: dict[str, int] = {}
        if workers:
            for endpoint in self.store.snapshot().endpoints:
                index = readers[endpoint.address] = reader_of(endpoint.address, workers)
                shares[index].append(
                    [endpoint.name, endpoint.address, dict(endpoint.labels), endpoint.id]
                )
        self._readers = readers
        for index, link in live:
            if self._sent.get(index) != shares[index]:
                self._sent[index] = shares[index]
                link.send([wire.SCRAPE, shares[index]])

    def lost(self, index: int) -> None:
        """Worker `index` is gone: a process started in its place reads nothing yet."""
        self._sent.pop(index, None)

    def apply(self, index: int, message: wire.Message) -> bool:
        """A METRICS or SCRAPE_FAILED message from worker `index`; whether the
        core should look again."""
        address = message[1]
        if self._readers.get(address) != index:
            return False
        if message[0] == wire.METRICS:
            self.reads += 1
            metrics = wire.metrics_from_fields(message[2:])
            record_read(self.store, address, metrics)
            return True
        self.failures_by_reason[message[2]] += 1
        return record_failure(self.store, address, message[2])


class ScrapeShare:
    """A worker's side: a `MetricsScraper` over the endpoints the owner
    gave it, each read worth telling sent as a message."""

    __slots__ = ("_keepalive", "_send", "_sent", "scraper", "store")

    def __init__(self, settings: ScrapeSettings, send: Callable[[wire.Message], None]) -> None:
        self.store = EndpointStore()
        self._send = send
        self._keepalive = settings.staleness / 2
        self._sent: dict[str, EndpointMetrics] = {}
        self.scraper = MetricsScraper(
            self.store,
            interval=settings.interval,
            timeout=settings.timeout,
            source=settings.source,
            engines=settings.engines,
            on_read=self._read,
        )

    def assign(self, share: list[list[object]]) -> None:
        """Read exactly these endpoints ([name, address, labels, id] each)."""
        self.store.replace_all(
            EndpointSpec(name, address, labels, id)  # type: ignore[arg-type]
            for name, address, labels, id in share
        )
        for address in [a for a in self._sent if self.store.get(a) is None]:
            del self._sent[address]

    def _read(self, address: str, metrics: EndpointMetrics | None, reason: str | None) -> None:
        if metrics is None:
            self._sent.pop(address, None)
            self._send([wire.SCRAPE_FAILED, address, reason])
            return
        last = self._sent.get(address)
        if (
            last is None
            or not last.same_values(metrics)
            or metrics.updated_at - last.updated_at >= self._keepalive  # type: ignore[operator]
        ):
            self._sent[address] = metrics
            self._send([wire.METRICS, address, *wire.metrics_fields(metrics)])
