"""In-flight eviction through a real Envoy: a sheddable request held at the
upstream is evicted for a higher band waiting on the one endpoint credit; its
client gets 429 with `x-llm-d-request-dropped-reason: evicted` and the
waiting request is served on the credit it gave back."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.support.envoy import running_envoy
from tests.support.epp_process import objectives_yaml, running_epp
from tests.support.fake_vllm import running_fake_vllm
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy]

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  enableEviction: true
  gate:
    kinds: [concurrency]
    maxPerEndpoint: 1
"""

OBJECTIVES = objectives_yaml("e2e-pool", batch=-1, chat=10)


async def post(session, url, prompt, objective):
    data = json.dumps({"model": "m", "prompt": prompt}).encode()
    headers = {"x-llm-d-inference-objective": objective}
    async with session.post(url, data=data, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


async def test_a_sheddable_request_in_flight_is_evicted_for_a_waiting_higher_band(tmp_path):
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "objectives.yaml").write_text(OBJECTIVES)
    async with (
        running_fake_vllm() as upstream,
        running_epp(
            f"--config-file={tmp_path / 'config.yaml'}",
            f"--objectives={tmp_path / 'objectives.yaml'}",
            "--pool-name=e2e-pool",
            f"--endpoints={upstream.address}",
        ) as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        batch = asyncio.create_task(post(session, url, "hold-batch", "batch"))
        await eventually(lambda: len(upstream.received) == 1, timeout=10)
        chat = asyncio.create_task(post(session, url, "chat", "chat"))
        status, headers, body = await asyncio.wait_for(batch, 10)
        assert (status, headers.get("x-llm-d-request-dropped-reason")) == (429, "evicted")
        assert body == b"request evicted by flow control\n"
        chat_status, _, _ = await asyncio.wait_for(chat, 10)
        assert chat_status == 200
        assert [r["prompt"] for r in upstream.received] == ["hold-batch", "chat"]
        upstream.release.set()
        async with session.get(epp.metrics_url) as response:
            metrics = await response.text()
        errors = [
            line
            for line in metrics.splitlines()
            if line.startswith("llm_d_epp_request_error_total{")
            and 'error_code="ResourceExhausted"' in line
        ]
        assert len(errors) == 1 and errors[0].endswith(" 1.0"), errors
        running = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("llm_d_epp_request_running{")
        ]
        assert running and sum(running) == 0.0  # the evicted request's credit came back once
