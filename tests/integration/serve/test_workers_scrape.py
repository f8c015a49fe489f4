"""Model-server metrics under `epp serve --workers 2` (`epp.serve.scrapes`):
the workers read the pages and the owner's store, hence its /metrics, shows
every endpoint's values; a worker killed with SIGKILL leaves no endpoint
stuck on its last values; a page that stops answering is counted and stale.
Real processes, real HTTP pages on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.support.epp_process import LOOPBACK, RunningEpp, running_epp
from tests.support.http_server import http_sites, request_port
from tests.support.metrics_page import fetch_page

pytestmark = pytest.mark.skipif(
    os.environ.get("EPP_TEST_WORKERS") not in (None, "2"), reason="runs its own --workers 2"
)

ENDPOINTS = 12
WORKER_STARTED = re.compile(r"epp worker (\d+) started \(pid (\d+)\)")
WORKER_SERVING = re.compile(r"epp worker \d+ serving")


class Pages:
    """One vLLM metrics page per port, each showing its own waiting count."""

    def __init__(self) -> None:
        self.waiting: dict[int, int] = {}
        self.down: set[int] = set()

    def page(self, port: int) -> str:
        return (
            f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting[port]}\n'
            'vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
        )


@contextlib.asynccontextmanager
async def served(pages: Pages) -> AsyncIterator[list[int]]:
    async def metrics(request: web.Request) -> web.Response:
        port = request_port(request)
        if port in pages.down:
            return web.Response(status=503)
        return web.Response(text=pages.page(port), content_type="text/plain")

    async with http_sites({"/metrics": metrics}, ENDPOINTS) as ports:
        pages.waiting.update(dict.fromkeys(ports, 0))
        yield ports


async def per_endpoint(session: aiohttp.ClientSession, epp: RunningEpp, name: str) -> dict:
    return (await fetch_page(session, epp.metrics_url)).by_label("model_server_endpoint", name)


async def until(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def pool_under_workers(pages: Pages) -> AsyncIterator[tuple[RunningEpp, list[int]]]:
    async with served(pages) as ports:
        pool = ",".join(f"{LOOPBACK}:{port}" for port in ports)
        async with running_epp(
            f"--endpoints={pool}", "--workers=2", "--refresh-metrics-interval=50ms"
        ) as epp:
            yield epp, ports


async def serving(epp: RunningEpp, processes: int) -> bool:
    """Whether `processes` worker processes served so far (restarts included)."""
    return len(WORKER_SERVING.findall(epp.log())) == processes


def queue_sizes(values: dict, ports: list[int]) -> dict[int, float]:
    """The owner's per-endpoint queue size by port (endpoint names end in their port)."""
    by_port = {}
    for name, value in values.items():
        for port in ports:
            if name is not None and name.endswith(str(port)):
                by_port[port] = value
    return by_port


async def test_every_endpoint_read_by_a_worker_reaches_the_owners_store() -> None:
    pages = Pages()
    async with pool_under_workers(pages) as (epp, ports), aiohttp.ClientSession() as session:
        for n, port in enumerate(ports):
            pages.waiting[port] = n + 1

        async def all_read() -> bool:
            values = await per_endpoint(session, epp, "llm_d_epp_per_endpoint_queue_size")
            return queue_sizes(values, ports) == {port: n + 1 for n, port in enumerate(ports)}

        await until(all_read)
        assert "no metrics-data-source" not in epp.log()


async def test_each_killed_workers_endpoints_are_read_by_the_other_then_by_its_restart() -> None:
    pages = Pages()
    async with pool_under_workers(pages) as (epp, ports), aiohttp.ClientSession() as session:

        async def shows(expected: int) -> bool:
            values = await per_endpoint(session, epp, "llm_d_epp_per_endpoint_queue_size")
            return queue_sizes(values, ports) == dict.fromkeys(ports, expected)

        await until(lambda: shows(0))
        first, second = (int(pid) for _, pid in WORKER_STARTED.findall(epp.log()))
        os.kill(first, signal.SIGKILL)
        for port in ports:
            pages.waiting[port] = 7
        await until(lambda: shows(7))
        await until(lambda: serving(epp, 3))
        os.kill(second, signal.SIGKILL)
        await until(lambda: serving(epp, 4))
        for port in ports:
            pages.waiting[port] = 9
        await until(lambda: shows(9))


async def test_a_page_that_fails_is_counted_on_the_owner() -> None:
    pages = Pages()
    async with pool_under_workers(pages) as (epp, ports), aiohttp.ClientSession() as session:
        pages.down.add(ports[0])

        async def counted() -> bool:
            page = await fetch_page(session, epp.metrics_url)
            failures = page.total("epp_model_server_scrape_failures_total", reason="http-status")
            stale = page.series("llm_d_epp_flow_control_stale_endpoints")
            return failures > 0 and bool(stale) and max(s.value for s in stale) == 1

        await until(counted)
