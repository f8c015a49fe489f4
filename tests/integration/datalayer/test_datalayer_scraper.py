"""The scraper against real HTTP /metrics servers on 127.0.0.1."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.scraper import Coalesced, MetricsScraper
from epp.datalayer.store import EndpointStore
from epp.scheduling.endpoint import ENGINE_TYPE_LABEL
from tests.support.waiting import eventually

VLLM_PAGE = (Path(__file__).parent / "vllm_metrics.txt").read_text()
SGLANG_PAGE = "sglang:num_queue_reqs 2\nsglang:num_running_reqs 5\nsglang:token_usage 0.3\n"
TRTLLM_PAGE = (
    "trtllm_num_requests_waiting 1\ntrtllm_num_requests_running 4\n"
    "trtllm_kv_cache_utilization 0.6\n"
)
INTERVAL = 0.02


@contextlib.asynccontextmanager
async def metrics_server(
    respond: Callable[[], web.Response] | None = None, delay: float = 0.0, page: str = VLLM_PAGE
) -> AsyncIterator[TestServer]:
    """A /metrics server on a free loopback port, stopped on exit."""

    async def handle(request: web.Request) -> web.Response:
        if delay:
            await asyncio.sleep(delay)
        return respond() if respond is not None else web.Response(text=page)

    app = web.Application()
    app.router.add_get("/metrics", handle)
    server = TestServer(app, host="127.0.0.1", port=None)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


def spec(server: TestServer, engine: str = "vllm") -> EndpointSpec:
    address = f"127.0.0.1:{server.port}"
    return EndpointSpec(address, address, {ENGINE_TYPE_LABEL: engine})


def scraper(store: EndpointStore, **options) -> MetricsScraper:
    options.setdefault("interval", INTERVAL)
    options.setdefault("timeout", 0.2)
    return MetricsScraper(store, **options)


async def test_a_vllm_server_is_scraped_into_the_store():
    async with metrics_server() as server:
        store = EndpointStore([spec(server)])
        async with scraper(store):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
    metrics = store.snapshot().endpoints[0].metrics
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == (3.0, 7.0, 0.42)
    assert metrics.lora_running == {"sql-lora", "chat-lora"}
    assert metrics.block_size == 16


async def test_an_sglang_server_is_scraped_with_sglang_names():
    async with metrics_server(page=SGLANG_PAGE) as server:
        store = EndpointStore([spec(server, "sglang")])
        async with scraper(store):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
    metrics = store.snapshot().endpoints[0].metrics
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == (2, 5, 0.3)


async def test_a_trtllm_server_is_scraped_with_trtllm_names():
    async with metrics_server(page=TRTLLM_PAGE) as server:
        store = EndpointStore([spec(server, "trtllm-serve")])
        async with scraper(store):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
    metrics = store.snapshot().endpoints[0].metrics
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == (1, 4, 0.6)


def failing_in(store: EndpointStore) -> Callable[[], bool]:
    return lambda: store.snapshot().endpoints[0].metrics.failing


async def test_a_server_slower_than_the_timeout_is_marked_stale_and_kept():
    async with metrics_server(delay=1.0) as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, timeout=0.05):
            await eventually(failing_in(store))
    assert len(store) == 1


async def test_a_server_answering_500_is_marked_stale_and_kept():
    async with metrics_server(lambda: web.Response(status=500, text="boom")) as server:
        store = EndpointStore([spec(server)])
        async with scraper(store):
            await eventually(failing_in(store))
    assert len(store) == 1


async def test_a_server_returning_garbage_is_marked_stale():
    async with metrics_server(page="<html>not metrics</html>\x00\x01") as server:
        store = EndpointStore([spec(server)])
        async with scraper(store):
            await eventually(failing_in(store))


async def test_a_server_without_its_engines_series_is_marked_stale():
    async with metrics_server(page=SGLANG_PAGE) as server:
        store = EndpointStore([spec(server, "vllm")])
        async with scraper(store):
            await eventually(failing_in(store))


async def test_a_closed_port_is_marked_stale():
    async with metrics_server() as server:
        closed = spec(server)
    store = EndpointStore([closed])
    async with scraper(store):
        await eventually(failing_in(store))


async def test_a_recovered_server_is_fresh_again():
    status = [500]
    async with metrics_server(lambda: web.Response(status=status[0], text=VLLM_PAGE)) as server:
        store = EndpointStore([spec(server)])
        async with scraper(store):
            await eventually(failing_in(store))
            status[0] = 200
            await eventually(lambda: not failing_in(store)())
    assert store.snapshot().endpoints[0].metrics.waiting == 3.0


async def test_a_slow_endpoint_does_not_delay_the_others():
    async with metrics_server(delay=5.0) as slow, metrics_server() as fast:
        store = EndpointStore([spec(slow), spec(fast)])
        fast_address = spec(fast).address

        def fast_read_at() -> float | None:
            return store.get(fast_address).metrics.updated_at

        async with scraper(store, timeout=2.0):
            await eventually(lambda: fast_read_at() is not None)
            first = fast_read_at()
            await eventually(lambda: fast_read_at() > first + 0.2, timeout=1.5)
            assert store.get(spec(slow).address).metrics.updated_at is None


async def test_a_change_is_announced():
    calls = []
    async with metrics_server() as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, on_change=lambda: calls.append(1)):
            await eventually(lambda: len(calls) >= 1)
    assert store.snapshot().endpoints[0].metrics.waiting == 3.0


async def test_announcements_in_one_loop_iteration_are_coalesced():
    calls = []
    announce = Coalesced(lambda: calls.append(1))
    announce()
    announce()
    await asyncio.sleep(0)
    announce()
    await asyncio.sleep(0)
    assert calls == [1, 1]


async def test_unchanged_reads_are_not_announced():
    calls = []
    async with metrics_server() as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, on_change=lambda: calls.append(1), staleness=10.0):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
            first = store.snapshot().endpoints[0].metrics.updated_at
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at > first)
            await asyncio.sleep(INTERVAL * 3)
    assert calls == [1]


async def test_an_endpoint_added_later_is_scraped():
    async with metrics_server() as first, metrics_server() as later:
        store = EndpointStore([spec(first)])
        async with scraper(store):
            store.upsert(spec(later))
            await eventually(lambda: store.get(spec(later).address).metrics.updated_at is not None)


async def test_a_removed_endpoint_is_no_longer_scraped():
    hits = []

    def count() -> web.Response:
        hits.append(1)
        return web.Response(text=VLLM_PAGE)

    async with metrics_server(count) as server:
        store = EndpointStore([spec(server)])
        async with scraper(store):
            await eventually(lambda: len(hits) >= 1)
            store.remove(spec(server).address)
            await asyncio.sleep(INTERVAL * 2)
            seen = len(hits)
            await asyncio.sleep(INTERVAL * 5)
    assert len(hits) == seen


async def test_a_read_after_the_previous_turned_stale_is_announced():
    calls = []
    async with metrics_server() as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, on_change=lambda: calls.append(1), staleness=0.0):
            await eventually(lambda: len(calls) >= 3)
