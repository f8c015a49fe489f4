"""`epp serve` behind a real Envoy: an empty pool, endpoint-file changes and
graceful shutdown. Each test starts (and stops) its own EPP and Envoy."""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
import pytest
from grpc_health.v1 import health_pb2

from tests.support.envoy import running_envoy
from tests.support.epp_process import running_epp
from tests.support.fake_vllm import running_fake_vllm
from tests.support.health import health_status_at
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy]

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

ONE_CREDIT = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  gate: {kinds: [concurrency], maxPerEndpoint: 1}
"""


async def post(session, url, prompt="p", headers=None):
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    async with session.post(url, data=body, headers=headers or {}) as response:
        return response.status, dict(response.headers), await response.read()


async def test_empty_pool_answers_503_no_endpoints_when_the_ttl_is_spent(tmp_path):
    endpoints = tmp_path / "endpoints.txt"
    endpoints.write_text("# scaled to zero\n")
    async with (
        running_epp(f"--endpoints=@{endpoints}") as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        status, headers, _ = await post(session, url, headers={"x-llm-d-inference-ttl": "200ms"})
    assert (status, headers.get("x-llm-d-request-dropped-reason")) == (
        503,
        "rejected-no-endpoints",
    )


async def test_queued_request_goes_to_an_endpoint_added_to_the_endpoints_file(tmp_path):
    endpoints = tmp_path / "endpoints.txt"
    endpoints.write_text("")
    async with (
        running_fake_vllm() as upstream,
        running_epp(f"--endpoints=@{endpoints}", "--file-watch-interval=50ms") as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        request = asyncio.create_task(post(session, url))
        await epp.wait_queued(session, 1)
        assert not request.done()
        endpoints.write_text(f"{upstream.address}\n")
        status, _, body = await asyncio.wait_for(request, 10)
    assert status == 200
    assert json.loads(body)["served_by"] == upstream.address


async def test_sigterm_drains_queued_and_running_requests_and_refuses_new_ones(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(ONE_CREDIT)
    async with (
        running_fake_vllm() as upstream,
        running_epp(
            f"--endpoints={upstream.address}", f"--config-file={config}", "--drain-timeout=30s"
        ) as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        running = asyncio.create_task(post(session, url, "hold"))
        await eventually(lambda: len(upstream.received) == 1, timeout=10)
        waiting = asyncio.create_task(post(session, url, "queued"))
        await epp.wait_queued(session, 1)
        epp.process.send_signal(signal.SIGTERM)
        await eventually(lambda: "shutting down" in epp.log(), timeout=10)
        readiness = await health_status_at(epp.ports["grpc_health"])
        assert readiness == health_pb2.HealthCheckResponse.NOT_SERVING
        status, headers, _ = await post(session, url, "late")
        assert (status, headers.get("x-llm-d-request-dropped-reason")) == (
            503,
            "rejected-shutting-down",
        )
        upstream.release.set()
        assert (await running)[0] == 200
        assert (await waiting)[0] == 200
        epp.process.send_signal(signal.SIGTERM)  # a second signal ends the 30 s window
        assert await asyncio.wait_for(epp.process.wait(), 10) == 0
    assert [r["prompt"] for r in upstream.received] == ["hold", "queued"]


async def test_sigterm_under_load_behind_envoy_gives_200_to_running_and_503_to_new_never_500():
    window_s = 5.0
    async with (
        running_fake_vllm() as upstream,
        running_epp(f"--endpoints={upstream.address}", f"--drain-timeout={window_s:g}s") as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        running = [asyncio.create_task(post(session, url, f"hold {i}")) for i in range(3)]
        await eventually(lambda: upstream.running == 3, timeout=10)
        answers: list[tuple[int, str | None]] = []
        load_on = True

        async def load() -> None:
            while load_on:
                status, headers, _ = await post(session, url, "new")
                answers.append((status, headers.get("x-llm-d-request-dropped-reason")))
                await asyncio.sleep(0.02)

        clients = [asyncio.create_task(load()) for _ in range(4)]
        await eventually(lambda: len(answers) >= 20, timeout=10)
        epp.process.send_signal(signal.SIGTERM)
        signalled = len(answers)
        await eventually(lambda: "shutting down" in epp.log(), timeout=10)
        await asyncio.sleep(1.0)  # the load goes on inside the drain window
        upstream.release.set()
        assert [(await request)[0] for request in running] == [200] * 3
        load_on = False
        await asyncio.gather(*clients)
        assert await asyncio.wait_for(epp.process.wait(), window_s + 5) == 0
    during = answers[signalled:]
    assert set(answers[:signalled]) == {(200, None)}
    assert (503, "rejected-shutting-down") in during
    assert set(during) <= {(200, None), (503, "rejected-shutting-down")}, set(during)
