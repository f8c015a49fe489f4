"""Envoy -> our ext_proc server (stream machine + trivial admission) -> aiohttp upstream.

Proves the Envoy config in config/envoy/ and the tests/support/envoy.py harness
end to end, with a fixed endpoint instead of the flow controller.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from epp.extproc.server import PROCESS_METHOD, ExtProcService
from epp.extproc.stream import StreamSettings
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, Usage
from epp.serve.tls import server_ssl_context
from epp.transport import GrpcServer
from tests.support.envoy import running_envoy
from tests.support.upstream import http_upstream
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

MAX_BODY = 4096


@dataclass
class FixedAdmission:
    """Dispatches every request to one endpoint, or answers `outcome` if set."""

    endpoint: str
    outcome: Outcome = Outcome.DISPATCHED
    completed: list[tuple[FlowRequest, Usage | None]] = field(default_factory=list)
    hold: bool = False
    waiting: int = 0
    withdrawn: int = 0

    def offer(self, request: FlowRequest) -> Outcome | None:
        if self.hold:
            return None
        if self.outcome.is_dispatched:
            request.endpoint = self.endpoint
        return self.outcome

    async def wait(self, request: FlowRequest) -> Outcome:
        self.waiting += 1
        await asyncio.Event().wait()
        raise AssertionError("never reached")

    def withdraw(self, request: FlowRequest) -> None:
        self.withdrawn += 1

    def complete(self, request: FlowRequest, usage=None, itl=None) -> None:
        self.completed.append((request, usage))

    def first_token(self, request: FlowRequest) -> None:
        pass

    def prefill_done(self, request: FlowRequest) -> None:
        pass


@dataclass
class Upstream:
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    proceed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append((dict(request.headers), body))
        if not json.loads(body).get("stream"):
            usage = {"prompt_tokens": 7, "completion_tokens": 3}
            return web.json_response({"model": "target", "usage": usage})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"model":"target","choices":[{"text":"a"}]}\n\n')
        await self.proceed.wait()
        usage = b'{"prompt_tokens":5,"completion_tokens":1}'
        await response.write(b'data: {"choices":[],"usage":' + usage + b"}\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@dataclass
class Stack:
    url: str
    admission: FixedAdmission
    upstream: Upstream
    service: ExtProcService


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack():
    upstream = Upstream()
    async with http_upstream(upstream.handle) as upstream_port:
        settings = StreamSettings(max_body_bytes=MAX_BODY)
        admission = FixedAdmission(endpoint=f"127.0.0.1:{upstream_port}")
        service = ExtProcService(admission, lambda headers: 0, settings)
        server = GrpcServer({PROCESS_METHOD: service.open})
        epp_port = await server.start("127.0.0.1", 0, server_ssl_context())
        try:
            async with running_envoy(epp_port=epp_port) as envoy:
                yield Stack(f"http://127.0.0.1:{envoy.listen_port}", admission, upstream, service)
        finally:
            await server.stop(grace=None)


@pytest.fixture(autouse=True)
def fresh(stack):
    stack.admission.outcome = Outcome.DISPATCHED
    stack.admission.hold = False
    stack.admission.waiting = stack.admission.withdrawn = 0
    stack.admission.completed.clear()
    stack.upstream.received.clear()
    stack.upstream.proceed.clear()
    yield
    stack.upstream.proceed.set()


async def post(url: str, body: bytes, headers: dict[str, str] | None = None):
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=headers or {}) as response,
    ):
        return response.status, dict(response.headers), await response.read()


async def test_request_reaches_upstream_with_control_headers_removed_and_body_intact(stack):
    body = json.dumps({"model": "m", "prompt": "hello"}).encode()
    control = {
        "x-llm-d-inference-objective": "gold",
        "x-gateway-inference-fairness-id": "tenant",
        "x-llm-d-inference-ttl": "30s",
        "x-llm-d-slo-ttft-ms": "500",
    }
    status, _, reply = await post(f"{stack.url}/v1/completions", body, {**control, "x-other": "1"})
    assert status == 200
    headers, received = stack.upstream.received[0]
    assert received == body
    assert not set(control) & {name.lower() for name in headers}
    assert headers["x-other"] == "1"
    assert headers["x-gateway-destination-endpoint"] == stack.admission.endpoint
    assert json.loads(reply)["usage"]["completion_tokens"] == 3
    await eventually(lambda: len(stack.admission.completed) == 1)
    request, usage = stack.admission.completed[0]
    assert (request.fairness_id, request.ttl, usage) == ("tenant", 30.0, Usage(7, 3))


async def test_rewritten_model_goes_upstream_and_client_sees_its_own_name(stack):
    body = json.dumps({"model": "alias", "prompt": "hi"}).encode()
    rewrite = {"x-llm-d-model-name-rewrite": "target"}
    status, _, reply = await post(f"{stack.url}/v1/completions", body, rewrite)
    assert status == 200
    _, received = stack.upstream.received[0]
    assert json.loads(received)["model"] == "target"
    assert json.loads(reply)["model"] == "alias"


async def test_streamed_response_arrives_chunk_by_chunk(stack):
    body = json.dumps({"model": "m", "prompt": "p", "stream": True}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", data=body) as response,
    ):
        assert response.status == 200
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
        assert b'"text":"a"' in first
        stack.upstream.proceed.set()
        rest = await response.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    await eventually(lambda: len(stack.admission.completed) == 1)
    assert [usage for _, usage in stack.admission.completed] == [Usage(5, 1)]


async def test_invalid_json_is_answered_400_by_envoy(stack):
    status, _, reply = await post(f"{stack.url}/v1/completions", b"{not json")
    assert status == 400
    assert b"bad request" in reply
    assert stack.upstream.received == []


async def test_body_over_limit_is_answered_413(stack):
    body = json.dumps({"model": "m", "prompt": "x" * (MAX_BODY * 4)}).encode()
    status, _, _ = await post(f"{stack.url}/v1/completions", body)
    assert status == 413
    assert stack.upstream.received == []


async def test_rejected_outcome_carries_status_and_dropped_reason(stack):
    stack.admission.outcome = Outcome.REJECTED_SATURATED
    status, headers, reply = await post(
        f"{stack.url}/v1/completions", b'{"model":"m","prompt":"p"}'
    )
    assert status == 429
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert b"rejected-saturated" in reply
    assert stack.admission.completed == []


async def test_client_gone_while_queued_withdraws_the_request(stack):
    stack.admission.hold = True
    body = json.dumps({"model": "m", "prompt": "p"}).encode()
    client = asyncio.create_task(post(f"{stack.url}/v1/completions", body))
    await eventually(lambda: stack.admission.waiting == 1)
    client.cancel()
    await eventually(lambda: stack.admission.withdrawn == 1)
    await eventually(lambda: stack.service.open_streams == 0)
    assert stack.admission.completed == []


async def test_client_gone_mid_response_releases_the_request(stack):
    body = json.dumps({"model": "m", "prompt": "p", "stream": True}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", data=body) as response,
    ):
        await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
        response.close()
    await eventually(lambda: len(stack.admission.completed) == 1)
    assert stack.admission.completed[0][1] is None
    await eventually(lambda: stack.service.open_streams == 0)
