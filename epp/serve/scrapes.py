"""Model-server metrics under `epp serve --workers N`: the workers read the
pages, the core owner keeps the store (docs/operations/workers.md).

    owner: ScrapeShares --SCRAPE (a worker's share)--> worker: ScrapeShare
           store <-- record_read / record_failure <-- METRICS, FRESH, SCRAPE_FAILED
                                                      (one per read)

Each endpoint is read by one live worker, chosen by rendezvous hashing of
(worker, address): an endpoint joining or leaving moves no other, and a
worker that dies hands only its own endpoints to the others (and takes a
share back when it serves again). Until the new reader's first read, the
endpoint's last values age in the store as any unread endpoint's do, so
the staleness policy judges them; a read from a worker that no longer reads
that endpoint is dropped.

Every read reaches the owner, as every read reaches the store in one
process: a read whose values (latency counters included) equal the last
one sent goes as its address and time alone (FRESH), any other in full
(METRICS), a failure as its reason (SCRAPE_FAILED). A read of the same
values is news too: the adaptive gate counts what was sent to an endpoint
after its last read as pending there, so the read's time alone may free
room it held back (`epp.datalayer.scraper`). The owner writes each into the
store as the in-process scraper does (`epp.datalayer.scraper.record_read`),
so the core sees the same snapshots at the same times, and pokes the
admission controller once per frame with a read or a new failure in it.
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
        """A FRESH, METRICS or SCRAPE_FAILED message from worker `index`;
        whether the core should look again."""
        address = message[1]
        if self._readers.get(address) != index:
            return False
        kind = message[0]
        if kind == wire.FRESH:
            endpoint = self.store.get(address)
            if endpoint is None or endpoint.metrics.updated_at is None:
                return False
            self.reads += 1
            record_read(self.store, address, endpoint.metrics._replace(updated_at=message[2]))
            return True
        if kind == wire.METRICS:
            self.reads += 1
            metrics = wire.metrics_from_fields(message[2:])
            record_read(self.store, address, metrics)
            return True
        self.failures_by_reason[message[2]] += 1
        return record_failure(self.store, address, message[2])


class ScrapeShare:
    """A worker's side: a `MetricsScraper` over the endpoints the owner
    gave it, each read sent as a message (see the module docstring)."""

    __slots__ = ("_send", "_sent", "scraper", "store")

    def __init__(self, settings: ScrapeSettings, send: Callable[[wire.Message], None]) -> None:
        self.store = EndpointStore()
        self._send = send
        self._sent: dict[str, EndpointMetrics] = {}
        """The values of the last METRICS sent per address (none after a failure)."""
        self.scraper = MetricsScraper(
            self.store,
            interval=settings.interval,
            timeout=settings.timeout,
            source=settings.source,
            engines=settings.engines,
            on_read=self.on_read,
        )

    def assign(self, share: list[list[object]]) -> None:
        """Read exactly these endpoints ([name, address, labels, id] each)."""
        self.store.replace_all(
            EndpointSpec(name, address, labels, id)  # type: ignore[arg-type]
            for name, address, labels, id in share
        )
        for address in [a for a in self._sent if self.store.get(a) is None]:
            del self._sent[address]

    def on_read(self, address: str, metrics: EndpointMetrics | None, reason: str | None) -> None:
        """One read of `address` (None: it failed for `reason`), told to the owner."""
        if metrics is None:
            self._sent.pop(address, None)
            self._send([wire.SCRAPE_FAILED, address, reason])
            return
        last = self._sent.get(address)
        if last is not None and metrics.same_but_time(last):
            self._send([wire.FRESH, address, metrics.updated_at])
            return
        self._sent[address] = metrics
        self._send([wire.METRICS, address, *wire.metrics_fields(metrics)])
