"""Session affinity through a real Envoy: `epp serve` with four stand-in
model servers of equal load (the file-discovery format, namespace `team-a`).
Without a session the requests spread over the servers; with one, every
request of the session reaches the server its first request reached:

- `session-affinity-scorer` (default strategy): the response carries
  `x-session-token`, base64 of `team-a/<endpoint name>` as the reference
  writes it, and the client sends it back;
- `session-affinity-filter` with `strategy: session_id`, the id read from a
  cookie by `session-id-producer`."""

from __future__ import annotations

import base64
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.envoy import running_envoy
from tests.support.epp_process import running_epp
from tests.support.fake_vllm import running_fake_vllm

pytestmark = [pytest.mark.envoy]

HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
TOKEN_CONFIG = {
    **HEAD,
    "plugins": [
        {"type": "session-affinity-scorer"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "session-affinity-scorer", "weight": 10},
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}
COOKIE_CONFIG = {
    **HEAD,
    "plugins": [
        {"type": "session-id-producer", "parameters": {"cookieName": "chat"}},
        {
            "type": "session-affinity-filter",
            "parameters": {
                "strategy": "session_id",
                "sessionIdConfig": {
                    "sources": [
                        {"attribute": "SessionIDDataKey", "producer": "session-id-producer"}
                    ]
                },
            },
        },
        {"type": "queue-scorer"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [{"pluginRef": "session-affinity-filter"}, {"pluginRef": "queue-scorer"}],
        }
    ],
}


class Stack:
    """Four model servers, `epp serve` with `config`, Envoy in front."""

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        self.folder = folder
        self.config = config
        self.servers: list[Any] = []
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Stack:
        stack = self._stack
        self.servers = [await stack.enter_async_context(running_fake_vllm()) for _ in range(4)]
        entries = []
        for index, server in enumerate(self.servers):
            server.release.set()
            host, port = server.address.rsplit(":", 1)
            entries.append(
                {"name": f"vllm-{index}", "namespace": "team-a", "address": host, "port": port}
            )
        endpoints = self.folder / "endpoints.yaml"
        endpoints.write_text(yaml.safe_dump({"endpoints": entries}))
        config = self.folder / "config.yaml"
        config.write_text(yaml.safe_dump(self.config))
        epp = await stack.enter_async_context(
            running_epp(
                f"--config-file={config}",
                f"--endpoints=@{endpoints}",
                "--pool-name=e2e-pool",
                "--allow-experimental-plugins",  # the session plugins are alpha, as there
            )
        )
        self.epp = epp
        envoy = await stack.enter_async_context(running_envoy(epp_port=epp.ports["grpc"]))
        self.url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        self.session = await stack.enter_async_context(aiohttp.ClientSession())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def post(self, headers: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
        """(the server that answered, the response headers)."""
        body = json.dumps({"model": "m", "prompt": "hello"}).encode()
        async with self.session.post(self.url, data=body, headers=headers or {}) as response:
            assert response.status == 200, await response.text()
            answer = await response.json()
            return answer["served_by"], dict(response.headers)

    def name_of(self, address: str) -> str:
        return f"vllm-{[server.address for server in self.servers].index(address)}"


async def test_requests_carrying_the_session_token_all_reach_the_first_ones_server(
    tmp_path,
) -> None:
    async with Stack(tmp_path, TOKEN_CONFIG) as stack:
        spread = {(await stack.post())[0] for _ in range(12)}
        first, headers = await stack.post()
        token = headers["x-session-token"]
        assert base64.b64decode(token).decode() == f"team-a/{stack.name_of(first)}"
        followers = []
        for _ in range(8):
            served, headers = await stack.post({"x-session-token": token})
            followers.append(served)
            assert headers["x-session-token"] == token
    assert len(spread) > 1
    assert followers == [first] * 8


async def test_requests_of_one_session_cookie_all_reach_the_first_ones_server(tmp_path) -> None:
    async with Stack(tmp_path, COOKIE_CONFIG) as stack:
        spread = {(await stack.post())[0] for _ in range(12)}
        sessions = {}
        for name in ("alice", "bob"):
            sessions[name] = [
                (await stack.post({"cookie": f"theme=dark; chat={name}"}))[0] for _ in range(6)
            ]
        async with stack.session.get(stack.epp.metrics_url) as response:
            exposition = await response.text()
    held = 'epp_session_bindings{inference_pool="e2e-pool",plugin="session-affinity-filter"}'
    assert f"{held} 2.0" in exposition
    assert len(spread) > 1
    for served in sessions.values():
        assert served == [served[0]] * 6
