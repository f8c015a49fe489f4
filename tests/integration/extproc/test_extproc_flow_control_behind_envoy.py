"""Envoy -> ext_proc adapter -> the real AdmissionController, Core and FlowController -> upstream.

One upstream endpoint with one in-flight credit: a request the upstream holds
saturates the pool, so everything sent after it queues in flow control.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from epp.extproc.server import PROCESS_METHOD, ExtProcService
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.gate import ConcurrencyGate
from epp.scheduling.core import Core
from epp.serve.admission import AdmissionController
from epp.serve.tls import server_ssl_context
from epp.transport import GrpcServer
from tests.support.envoy import running_envoy
from tests.support.placers import LeastLoadedPlacer
from tests.support.upstream import http_upstream
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

PRIORITIES = {"low": 0, "high": 10}


class HoldingUpstream:
    """Answers at once, except a request with prompt "hold", which waits for `release`."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        prompt = json.loads(await request.read())["prompt"]
        self.order.append(prompt)
        if prompt == "hold":
            await self.release.wait()
        return web.json_response({"usage": {"prompt_tokens": 1, "completion_tokens": 1}})


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack():
    upstream = HoldingUpstream()
    async with http_upstream(upstream.handle) as upstream_port:
        endpoint = f"127.0.0.1:{upstream_port}"
        gate = ConcurrencyGate(max_per_endpoint=1)
        placer = LeastLoadedPlacer(lambda: [endpoint], gate)
        admission = AdmissionController(Core(FlowController(FlowControlConfig(), gate, placer)))

        def priority_of(headers):
            return PRIORITIES.get(headers.get("x-llm-d-inference-objective", ""), 0)

        server = GrpcServer({PROCESS_METHOD: ExtProcService(admission, priority_of).open})
        port = await server.start("127.0.0.1", 0, server_ssl_context())
        try:
            async with running_envoy(epp_port=port) as envoy:
                yield f"http://127.0.0.1:{envoy.listen_port}/v1/completions", admission, upstream
        finally:
            upstream.release.set()
            await server.stop(grace=None)


async def send(session: aiohttp.ClientSession, url: str, prompt: str, objective: str = "low"):
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    headers = {"x-llm-d-inference-objective": objective}
    async with session.post(url, data=body, headers=headers) as response:
        return response.status


async def test_clients_gone_while_queued_leave_no_queue_or_in_flight_state(stack):
    url, admission, upstream = stack
    upstream.release.clear()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        holder = asyncio.create_task(send(session, url, "hold"))
        await eventually(lambda: admission.in_flight == 1, timeout=20)
        clients = [asyncio.create_task(send(session, url, f"q{i}")) for i in range(1000)]
        await eventually(lambda: admission.queued == 1000, timeout=20)
        for client in clients:
            client.cancel()
        await eventually(lambda: admission.queued == 0, timeout=20)
        upstream.release.set()
        assert await holder == 200
    await eventually(lambda: admission.in_flight == 0, timeout=20)
    assert [prompt for prompt in upstream.order if prompt.startswith("q")] == []


async def test_higher_priority_sent_later_is_served_first(stack):
    url, admission, upstream = stack
    upstream.release.clear()
    upstream.order.clear()
    async with aiohttp.ClientSession() as session:
        holder = asyncio.create_task(send(session, url, "hold"))
        await eventually(lambda: admission.in_flight == 1, timeout=20)
        low = [asyncio.create_task(send(session, url, f"low{i}", "low")) for i in range(3)]
        await eventually(lambda: admission.queued == 3, timeout=20)
        high = [asyncio.create_task(send(session, url, f"high{i}", "high")) for i in range(3)]
        await eventually(lambda: admission.queued == 6, timeout=20)
        upstream.release.set()
        assert await asyncio.gather(holder, *low, *high) == [200] * 7
    assert [prompt[:-1] for prompt in upstream.order[1:]] == ["high"] * 3 + ["low"] * 3
    await eventually(lambda: admission.in_flight == 0, timeout=20)
