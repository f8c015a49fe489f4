"""Envoy (two worker threads) -> `epp serve --workers 2` -> two simulated
vLLM servers (epp.demo.model_server), all on loopback: requests are served
through both protocol workers; a killed worker is started again and the
pool keeps serving; SIGTERM stops the owner and every worker."""

from __future__ import annotations

import asyncio
import json
import os
import re

import aiohttp
import pytest
import pytest_asyncio

from epp.demo.model_server import SimulatedServer
from epp.sim.server_model import ServerParams
from tests.support.envoy import running_envoy
from tests.support.epp_process import start_epp
from tests.support.metrics_page import MetricsPage, fetch_page
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

PARAMS = ServerParams(max_num_seqs=8, decode_ms_per_token=5.0, prefill_overhead_ms=1.0)
"""Tokens 5 ms apart, so that streamed chunks reach the EPP one by one."""
WORKER_STARTED = re.compile(r"epp worker (\d+) started \(pid (\d+)\)")


class Stack:
    def __init__(self, url, epp, servers) -> None:
        self.url = url
        self.epp = epp
        self.servers = servers

    def worker_pids(self) -> dict[int, int]:
        """The newest pid of each worker, from the owner's log."""
        return {int(w): int(p) for w, p in WORKER_STARTED.findall(self.epp.log())}

    async def page(self, session) -> MetricsPage:
        return await fetch_page(session, self.epp.metrics_url)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack():
    servers = [SimulatedServer(PARAMS, "m") for _ in range(2)]
    ports = [await server.start() for server in servers]
    endpoints = ",".join(f"127.0.0.1:{port}" for port in ports)
    epp = await start_epp(f"--endpoints={endpoints}", "--workers=2", "--drain-timeout=1s")
    try:
        async with running_envoy(epp_port=epp.ports["grpc"], concurrency=2) as envoy:
            yield Stack(f"http://127.0.0.1:{envoy.listen_port}/v1/completions", epp, servers)
    finally:
        await epp.terminate()
        for server in servers:
            await server.stop()


async def complete(session, url, prompt: str, stream: bool) -> tuple[int, bytes]:
    body = {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream}
    async with session.post(url, data=json.dumps(body)) as response:
        return response.status, await response.read()


async def burst(stack, count: int) -> list[tuple[int, bytes]]:
    # Many client connections, so that both Envoy threads take some.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await asyncio.gather(
            *(complete(session, stack.url, f"prompt {n}", n % 2 == 0) for n in range(count))
        )


async def test_requests_are_served_through_both_workers(stack) -> None:
    results = await burst(stack, 60)

    assert [status for status, _ in results] == [200] * 60, stack.epp.log()[-4000:]
    assert all(b"choices" in body for _, body in results)
    async with aiohttp.ClientSession() as session:
        page = await stack.page(session)
    requests = page.by_label("worker", "epp_worker_requests_total")
    connections = page.by_label("worker", "epp_worker_connections_total")
    assert sum(requests.values()) == 60
    assert requests["0"] > 0 and requests["1"] > 0
    assert connections["0"] >= 1 and connections["1"] >= 1


async def test_the_workers_connections_show_on_the_owners_transport_series(stack) -> None:
    async def grpc_connections() -> float:
        page = await stack.page(session)
        return page.total("epp_transport_connections", port="grpc")

    async with aiohttp.ClientSession() as session:
        # Envoy's two threads each hold a connection, on the two workers
        for _ in range(100):
            if await grpc_connections() >= 2:
                break
            await asyncio.sleep(0.1)
        assert await grpc_connections() >= 2


async def test_the_gaps_between_streamed_chunks_reach_the_owners_histogram(stack) -> None:
    async with aiohttp.ClientSession() as session:
        before = (await stack.page(session)).total("llm_d_epp_request_streaming_itl_seconds_count")
        results = await burst(stack, 20)
        assert [status for status, _ in results] == [200] * 20
        after = (await stack.page(session)).total("llm_d_epp_request_streaming_itl_seconds_count")
    # 10 streamed responses of 4 tokens: each at least one gap between its chunks
    assert after - before >= 10


async def test_both_workers_responses_are_on_the_owners_page_when_it_is_read(stack) -> None:
    async with aiohttp.ClientSession() as session:
        before = (await stack.page(session)).total("llm_d_epp_request_duration_seconds_count")
        results = await burst(stack, 20)
        assert [status for status, _ in results] == [200] * 20
        page = await stack.page(session)
    after = page.total("llm_d_epp_request_duration_seconds_count")
    running = page.total("llm_d_epp_request_running")
    served = page.by_label("worker", "epp_worker_requests_total")
    assert after - before == 20
    assert running == 0
    assert served["0"] > 0 and served["1"] > 0


async def test_a_killed_worker_is_started_again_and_the_pool_keeps_serving(stack) -> None:
    killed = stack.worker_pids()[1]
    os.kill(killed, 9)

    await eventually(lambda: stack.worker_pids()[1] != killed, timeout=20)
    async with aiohttp.ClientSession() as session:
        restarts = (await stack.page(session)).by_label("worker", "epp_worker_restarts_total")
    assert restarts == {"0": 0, "1": 1}
    results = await burst(stack, 20)
    assert [status for status, _ in results] == [200] * 20, stack.epp.log()[-4000:]


async def test_sigterm_stops_the_owner_and_every_worker(stack) -> None:
    pids = list(stack.worker_pids().values())

    assert await stack.epp.terminate() == 0

    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    log = stack.epp.log()
    assert "epp worker 0 stopped" in log and "epp worker 1 stopped" in log
    assert log.rstrip().endswith("epp.serve.server: stopped")
