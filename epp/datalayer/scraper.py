"""Scrape every endpoint's Prometheus page into the endpoint store.

Where a page is (`MetricsSource`): scheme, port (default the endpoint's),
path (default the endpoint's engine's: `/metrics`, trtllm-serve's
`/prometheus/metrics`) and TLS verification (off by default, as the
reference's `insecureSkipVerify: true`); the engine comes from the
endpoint's labels (`EngineLookup`). One asyncio task per endpoint reads its
page every `interval` seconds (the source's own, else the scraper's; a read
that takes longer delays only that endpoint's next read), with `timeout`
seconds per read and at most `max_page_bytes` per page, over one kept-alive
connection per endpoint (`PageFetcher`). A read that fails
(connection error, timeout, non-200 status, a JSON or oversized page, a
page without any of the engine's series) marks the endpoint failing, hence
stale, and keeps it in the pool; a page of the engine that lacks a load series reads as idle.
Tasks follow the store's membership.

After every good read, and after a read that failed where the previous
one had not, `on_change` is called once per event-loop iteration, however
many endpoints were read in it: the live shell passes
`AdmissionController.poke`. A read whose values did not move is news too:
the adaptive gate counts what was sent to an endpoint after its last read
as pending there, so each read's time alone may free room it held back
(an instant server reads idle at every sample, and requests queued behind
its pending budget would otherwise wait for an unrelated event).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from epp.api.address import format_address, parse_address
from epp.datalayer.engines import EngineLookup
from epp.datalayer.fetch import PageFetcher, ScrapeError
from epp.datalayer.polling import EndpointPolls
from epp.datalayer.reader import MetricsReader
from epp.datalayer.store import EndpointStore
from epp.scheduling.endpoint import Endpoint, EndpointMetrics

log = logging.getLogger(__name__)


MAX_PAGE_BYTES = 16 * 1024 * 1024
"""A metrics page larger than this fails the read (a vLLM page is ~50 KiB)."""


@dataclass(slots=True, frozen=True)
class MetricsSource:
    """Where the model servers' metrics pages are (the reference's
    `metrics-data-source` parameters). None means: the endpoint's port, its
    engine's path, the scraper's interval (`--refresh-metrics-interval`)."""

    scheme: str = "http"
    path: str | None = None
    port: int | None = None
    verify_tls: bool = False
    ca_cert_path: str | None = None
    client_cert_path: str | None = None
    client_key_path: str | None = None
    max_page_bytes: int = MAX_PAGE_BYTES
    interval: float | None = None

    def __post_init__(self) -> None:
        if self.interval is not None and not self.interval > 0:
            raise ValueError(f"metrics interval must be positive, got {self.interval}")
        if self.scheme not in ("http", "https"):
            raise ValueError(f"metrics scheme must be http or https, got {self.scheme!r}")
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError(f"metrics path must start with '/', got {self.path!r}")
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"metrics port must be 1-65535, got {self.port}")
        if (self.client_cert_path is None) != (self.client_key_path is None):
            raise ValueError("a client certificate and its key go together")
        if self.max_page_bytes <= 0:
            raise ValueError(f"max_page_bytes must be positive, got {self.max_page_bytes}")

    def url(self, endpoint: Endpoint, engine_path: str) -> str:
        ip, port = parse_address(endpoint.address)
        if self.port is not None:
            port = self.port
        return f"{self.scheme}://{format_address(ip, port)}{self.path or engine_path}"

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What a connection is opened with: False is plain HTTP."""
        if self.scheme != "https":
            return False
        if not self.verify_tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=self.ca_cert_path)
        if self.client_cert_path is not None:
            context.load_cert_chain(self.client_cert_path, self.client_key_path)
        return context


@dataclass(slots=True)
class _Target:
    """One endpoint's scrape state: its reader, what its URL was built
    from, and its connection."""

    reader: MetricsReader = field(default_factory=MetricsReader)
    labels: Mapping[str, str] | None = None
    fetcher: PageFetcher | None = None

    def close(self) -> None:
        if self.fetcher is not None:
            self.fetcher.close()
            self.fetcher = None


class Coalesced:
    """Calls `callback` soon (next event-loop iteration), once however many
    times it was asked to in the meantime."""

    __slots__ = ("_callback", "_pending")

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._pending = False

    def __call__(self) -> None:
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_soon(self._fire)

    def _fire(self) -> None:
        self._pending = False
        self._callback()


class MetricsScraper:
    """Keeps the store's metrics fresh; see the module docstring.

    `clock` stamps each read, at the time it was asked for (the gate and
    the scheduler must read the same clock). With `on_read`, each read is
    handed to it (address, metrics or None, the failure's reason) instead
    of the store, which then gives only
    membership and labels (a worker reading its share for the core owner,
    `epp.serve.scrapes`). Use as `async with MetricsScraper(...)`, or call
    `start()` and `stop()`.
    """

    def __init__(
        self,
        store: EndpointStore,
        on_change: Callable[[], None] | None = None,
        *,
        interval: float = 0.05,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        source: MetricsSource | None = None,
        engines: EngineLookup | None = None,
        on_read: Callable[[str, EndpointMetrics | None, str | None], None] | None = None,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"interval and timeout must be positive, got {interval}, {timeout}")
        self.store = store
        self.interval = interval
        if source is not None and source.interval is not None:
            self.interval = source.interval
        self.timeout = timeout
        self._on_change = Coalesced(on_change) if on_change is not None else None
        self._clock = clock
        self.source = source if source is not None else MetricsSource()
        self.engines = engines if engines is not None else EngineLookup()
        self._ssl = self.source.ssl_context()
        self._on_read = on_read
        self._polls = EndpointPolls(
            store, self.scrape_once, lambda: self.interval, "scrape", self._forget_left
        )
        self._targets: dict[str, _Target] = {}
        self.reads = 0
        self.failures = 0
        self.failures_by_reason: collections.Counter[str] = collections.Counter()
        """Failed reads by reason: timeout, connection, http-status,
        not-prometheus-text, too-large, unreadable (no engine series, bad value)."""

    async def start(self) -> None:
        self._polls.start()

    async def stop(self) -> None:
        await self._polls.stop()
        for target in self._targets.values():
            target.close()
        self._targets.clear()

    async def __aenter__(self) -> MetricsScraper:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _forget_left(self) -> None:
        current = set(self.store.addresses())
        for address in list(self._targets):
            if address not in current:
                self._targets.pop(address).close()

    async def scrape_once(self, address: str) -> None:
        """Read the page of `address` once into its store entry."""
        endpoint = self.store.get(address)
        if endpoint is None or not self._polls.running:
            return
        target = self._targets.get(address)
        if target is None:
            target = self._targets[address] = _Target()
        names = self.engines.names_for(endpoint.labels)
        if target.labels is not endpoint.labels or target.fetcher is None:
            target.labels = endpoint.labels
            url = self.source.url(endpoint, names.metrics_path)
            if target.fetcher is None or target.fetcher.url != url:
                target.close()
                target.fetcher = PageFetcher(url, self._ssl, self.source.max_page_bytes)
        # Stamped when asked: what was sent to the server after this may be
        # missing from the page (the gate counts it as pending).
        asked = self._clock()
        try:
            async with asyncio.timeout(self.timeout):
                text = await target.fetcher.get()
            metrics = target.reader.read(text, names, asked)
        except (ScrapeError, OSError, TimeoutError, ValueError) as error:
            self.failures += 1
            reason = _reason(error)
            self.failures_by_reason[reason] += 1
            if self._on_read is not None:
                self._on_read(address, None, reason)
            elif record_failure(self.store, address, str(error) or reason):
                self._changed()
            return
        self.reads += 1
        if self._on_read is not None:
            self._on_read(address, metrics, None)
        else:
            record_read(self.store, address, metrics)
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None and self._polls.running:
            self._on_change()


def record_read(store: EndpointStore, address: str, metrics: EndpointMetrics) -> None:
    """Write one good read of `address` into `store` (the core should then
    look again, whatever its values: see the module docstring)."""
    endpoint = store.get(address)
    if endpoint is None:
        return
    previous = endpoint.metrics
    store.set_metrics(address, metrics)
    if previous.failing:
        log.info("metrics of %s available again", address)


def record_failure(store: EndpointStore, address: str, why: str) -> bool:
    """A read of `address` failed: it turns stale at once. Whether it was
    not failing before (the core should look again)."""
    if not store.mark_failing(address):
        return False
    log.warning("metrics of %s unavailable, marked stale: %s", address, why)
    return True


def _reason(error: Exception) -> str:
    if isinstance(error, ScrapeError):
        return error.reason
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, OSError):
        return "connection"
    return "unreadable"
