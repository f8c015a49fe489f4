"""The reference's newest-release features behind a real Envoy: `epp serve`
(a subprocess) with an `llm-d.ai/v1` configuration, two stand-in vLLM
servers on loopback, all on 127.0.0.1.

- `models-responder`: a client's `GET /v1/models` through Envoy is answered
  by the EPP with the union of both servers' model lists (each server knows
  only its own LoRA adapter).
- `requestHandler.propagatePriority`: the objective's priority reaches the
  server in the body's `priority`, negated for a pod labelled as vLLM, and a
  client's own `priority` is replaced.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import pytest_asyncio
import yaml

from tests.support.envoy import running_envoy
from tests.support.epp_process import objectives_yaml, running_epp
from tests.support.fake_vllm import running_fake_vllm

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

CONFIG = {
    "apiVersion": "llm-d.ai/v1",
    "kind": "EndpointPickerConfig",
    "plugins": [{"type": "models-responder"}],
    "requestHandler": {"propagatePriority": True},
}


class Stack:
    url = ""
    upstreams: list = []


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("newest")
    async with running_fake_vllm() as first, running_fake_vllm() as second:
        first.models, second.models = ("base", "lora-a"), ("base", "lora-b")
        entries = []
        for index, server in enumerate((first, second)):
            host, port = server.address.rsplit(":", 1)
            entries.append(
                {
                    "name": f"vllm-{index}",
                    "address": host,
                    "port": port,
                    "labels": {"llm-d.ai/engine-type": "vllm"},
                }
            )
        (folder / "endpoints.yaml").write_text(yaml.safe_dump({"endpoints": entries}))
        (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        (folder / "objectives.yaml").write_text(objectives_yaml("e2e-pool", gold=7))
        async with (
            running_epp(
                f"--config-file={folder / 'config.yaml'}",
                f"--endpoints=@{folder / 'endpoints.yaml'}",
                f"--objectives={folder / 'objectives.yaml'}",
                "--pool-name=e2e-pool",
                "--allow-experimental-plugins",  # models-responder is alpha, as there
            ) as epp,
            running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        ):
            stack = Stack()
            stack.url = f"http://127.0.0.1:{envoy.listen_port}"
            stack.upstreams = [first, second]
            yield stack


async def list_models(url: str) -> tuple[int, str, object]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as response:
        return response.status, response.headers.get("content-type", ""), await response.read()


async def test_the_epp_answers_the_model_list_with_every_servers_models(stack) -> None:
    # Until both servers were read: 503 before the first, one list after it.
    for _ in range(200):
        status, content_type, body = await list_models(stack.url)
        if status == 200 and len(json.loads(body)["data"]) == 3:
            break
        await asyncio.sleep(0.05)
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body) == {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "owned_by": "vllm"}
            for model in ("base", "lora-a", "lora-b")
        ],
    }


async def test_the_objectives_priority_reaches_a_vllm_server_negated_in_the_body(stack) -> None:
    body = {"model": "base", "prompt": "p", "priority": 100}
    headers = {"x-llm-d-inference-objective": "gold"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
    received = [r["body"] for server in stack.upstreams for r in server.received]
    assert [r["priority"] for r in received] == [-7]
