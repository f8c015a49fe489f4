"""Scrape every endpoint's Prometheus `/metrics` into the endpoint store.

One asyncio task per endpoint reads its page every `interval` seconds (a
read that takes longer delays only that endpoint's next read), with
`timeout` seconds per read. A read that fails (connection error, timeout,
non-200 status, a page without the engine's series) marks the endpoint
failing, hence stale, and keeps it in the pool. Tasks follow the store's
membership.

After reads that changed what a gate or scorer would see (a value moved,
an endpoint failed or recovered, or a read came after the previous one
had turned stale), `on_change` is called once per event-loop iteration,
however many endpoints changed in it: the live shell passes
`AdmissionController.poke`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp

from epp.datalayer.engines import engine_metric_names
from epp.datalayer.reader import MetricsReader
from epp.datalayer.store import EndpointStore

log = logging.getLogger(__name__)


class ScrapeError(Exception):
    """A metrics page could not be read."""


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

    `clock` stamps each read (the gate and the scheduler must read the same
    clock). `staleness` is the age after which a read counts as new news even
    when its values did not change. Use as `async with MetricsScraper(...)`,
    or call `start()` and `stop()`.
    """

    def __init__(
        self,
        store: EndpointStore,
        on_change: Callable[[], None] | None = None,
        *,
        interval: float = 0.05,
        timeout: float = 1.0,
        staleness: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        path: str = "/metrics",
        scheme: str = "http",
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"interval and timeout must be positive, got {interval}, {timeout}")
        self.store = store
        self.interval = interval
        self.timeout = timeout
        self.staleness = staleness
        self._on_change = Coalesced(on_change) if on_change is not None else None
        self._clock = clock
        self._path = path
        self._scheme = scheme
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.reads = 0
        self.failures = 0
        self._running = False

    async def start(self) -> None:
        if self._running:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._running = True
        self.store.on_membership_change(self._follow_store)
        self._follow_store()

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> MetricsScraper:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _follow_store(self) -> None:
        if not self._running:
            return
        current = set(self.store.addresses())
        for address in list(self._tasks):
            if address not in current:
                self._tasks.pop(address).cancel()
        for address in current:
            if address not in self._tasks:
                self._tasks[address] = asyncio.get_running_loop().create_task(
                    self._scrape_forever(address), name=f"scrape {address}"
                )

    async def _scrape_forever(self, address: str) -> None:
        reader = MetricsReader()
        url = f"{self._scheme}://{address}{self._path}"
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.scrape_once(address, url, reader)
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    async def scrape_once(self, address: str, url: str, reader: MetricsReader) -> None:
        """Read `url` once into the store entry for `address`."""
        endpoint = self.store.get(address)
        session = self._session
        if endpoint is None or session is None:
            return
        try:
            names = engine_metric_names(endpoint.engine)
            async with asyncio.timeout(self.timeout):
                text = await _fetch(session, url)
            metrics = reader.read(text, names, self._clock())
        except (ScrapeError, aiohttp.ClientError, TimeoutError, ValueError) as error:
            self.failures += 1
            if self.store.mark_failing(address):
                log.warning(
                    "metrics of %s unavailable, marked stale: %s", address, error or "timeout"
                )
                self._changed()
            return
        self.reads += 1
        previous = endpoint.metrics
        changed = self.store.set_metrics(address, metrics)
        if previous.failing:
            log.info("metrics of %s available again", address)
        if changed or (
            previous.updated_at is not None
            and metrics.updated_at is not None
            and metrics.updated_at - previous.updated_at > self.staleness
        ):
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None and self._running:
            self._on_change()


async def _fetch(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        body = await response.read()
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status} from {url}")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ScrapeError(f"metrics page of {url} is not UTF-8: {error}") from None
