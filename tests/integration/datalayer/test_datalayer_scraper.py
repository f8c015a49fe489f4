"""The scraper against real HTTP /metrics servers on 127.0.0.1."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.engines import ENGINE_LABEL
from epp.datalayer.scraper import Coalesced, MetricsScraper, MetricsSource
from epp.datalayer.store import EndpointStore
from tests.support.http_server import http_server
from tests.support.waiting import eventually

PAGES = Path(__file__).parent / "pages"
VLLM_PAGE = (PAGES / "vllm_v1_0.10.txt").read_text()
SGLANG_PAGE = "sglang:num_queue_reqs 2\nsglang:num_running_reqs 5\nsglang:token_usage 0.3\n"
TRTLLM_PAGE = (PAGES / "trtllm_serve_1.2.txt").read_text()
INTERVAL = 0.02


@contextlib.asynccontextmanager
async def metrics_server(
    respond: Callable[[], web.Response] | None = None,
    delay: float = 0.0,
    page: str = VLLM_PAGE,
    path: str = "/metrics",
    ssl_context=None,
) -> AsyncIterator[TestServer]:
    """A metrics server at `path` on a free loopback port, stopped on exit."""

    async def handle(request: web.Request) -> web.Response:
        if delay:
            await asyncio.sleep(delay)
        return respond() if respond is not None else web.Response(text=page)

    async with http_server({path: handle}, ssl_context) as server:
        yield server


def spec(server: TestServer, engine: str = "vllm") -> EndpointSpec:
    address = f"127.0.0.1:{server.port}"
    return EndpointSpec(address, address, {ENGINE_LABEL: engine})


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


async def test_trtllm_serve_is_scraped_at_prometheus_metrics():
    async with metrics_server(page=TRTLLM_PAGE, path="/prometheus/metrics") as server:
        store = EndpointStore([spec(server, "trtllm-serve")])
        async with scraper(store):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
    metrics = store.snapshot().endpoints[0].metrics
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == (2, 6, 0.375)
    assert not metrics.failing


async def test_a_json_metrics_page_is_a_clear_failure(caplog):
    def iteration_stats() -> web.Response:
        return web.json_response([{"numActiveRequests": 1, "numQueuedRequests": 0}])

    async with metrics_server(iteration_stats) as server:
        store = EndpointStore([spec(server, "trtllm-serve")])
        async with scraper(store, source=MetricsSource(path="/metrics")):
            await eventually(failing_in(store))
    assert "/prometheus/metrics" in caplog.text


async def test_the_configured_path_and_port_are_scraped():
    async with metrics_server(path="/custom/metrics") as server:
        elsewhere = EndpointSpec("a", "127.0.0.1:1", {})
        store = EndpointStore([elsewhere])
        source = MetricsSource(path="/custom/metrics", port=server.port)
        async with scraper(store, source=source):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
    assert store.snapshot().endpoints[0].metrics.waiting == 3.0


async def test_https_is_scraped_without_verification_by_default():
    from epp.serve.tls import server_ssl_context

    async with metrics_server(ssl_context=server_ssl_context()) as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, source=MetricsSource(scheme="https")):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
    assert store.snapshot().endpoints[0].metrics.running == 7.0


async def test_https_with_verification_refuses_an_unknown_certificate():
    from epp.serve.tls import server_ssl_context

    async with metrics_server(ssl_context=server_ssl_context()) as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, source=MetricsSource(scheme="https", verify_tls=True)):
            await eventually(failing_in(store))
    assert store.snapshot().endpoints[0].metrics.updated_at is None


async def test_a_page_over_the_size_limit_fails_the_read():
    async with metrics_server() as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, source=MetricsSource(max_page_bytes=1000)) as running:
            await eventually(failing_in(store))
    assert running.failures_by_reason["too-large"] >= 1


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


async def test_a_read_is_announced_though_its_values_did_not_move():
    # The adaptive gate learns from when a read was made (what was sent
    # after it is pending), so a read of the same values may make room.
    calls = []
    async with metrics_server() as server:
        store = EndpointStore([spec(server)])
        async with scraper(store, on_change=lambda: calls.append(1), timeout=2.0):
            await eventually(lambda: store.snapshot().endpoints[0].metrics.updated_at is not None)
            for _ in range(3):  # three more reads of the same page
                before = store.snapshot().endpoints[0].metrics.updated_at
                await eventually(
                    lambda before=before: store.snapshot().endpoints[0].metrics.updated_at > before
                )
            await asyncio.sleep(
                0
            )  # the announcement of the last read comes at the loop's next turn
    assert len(calls) >= 4


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

    def scraping(address: str) -> bool:
        return any(task.get_name() == f"scrape {address}" for task in asyncio.all_tasks())

    async with metrics_server(count) as server:
        address = spec(server).address
        store = EndpointStore([spec(server)])
        async with scraper(store):
            await eventually(lambda: len(hits) >= 1)
            assert scraping(address)
            store.remove(address)
            await eventually(lambda: not scraping(address))
