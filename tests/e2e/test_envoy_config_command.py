"""`epp envoy-config`: the Envoy configuration it writes, run by a real Envoy
in front of a real `epp serve`, for an EPP at an IP address (file mode) and
at a DNS name (a pool's Service)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from epp.cli import main
from tests.support.envoy import running_envoy
from tests.support.epp_process import running_epp
from tests.support.fake_vllm import running_fake_vllm

pytestmark = [pytest.mark.envoy]


async def served_through(config, epp_port: int) -> int:
    async with (
        running_envoy(epp_port=epp_port, template=config) as envoy,
        aiohttp.ClientSession() as session,
    ):
        body = json.dumps({"model": "m", "prompt": "p"}).encode()
        async with session.post(f"{envoy.url}/v1/completions", data=body) as response:
            return response.status


async def test_the_file_mode_config_routes_through_a_tls_epp_at_an_ip(tmp_path):
    config = tmp_path / "envoy.yaml"
    async with (
        running_fake_vllm() as upstream,
        running_epp(f"--endpoints={upstream.address}") as epp,
    ):
        argv = ["envoy-config", "--listen=127.0.0.1:0", "--admin=127.0.0.1:0"]
        assert main([*argv, f"--epp=127.0.0.1:{epp.ports['grpc']}", f"-o={config}"]) == 0
        assert await served_through(config, epp.ports["grpc"]) == 200
    assert len(upstream.received) == 1


async def test_a_named_plaintext_epp_is_reached_through_a_strict_dns_cluster(tmp_path):
    config = tmp_path / "envoy.yaml"
    async with (
        running_fake_vllm() as upstream,
        running_epp(f"--endpoints={upstream.address}", "--secure-serving=false") as epp,
    ):
        argv = ["envoy-config", "--listen=127.0.0.1:0", "--admin=127.0.0.1:0", "--plaintext"]
        assert main([*argv, f"--epp=localhost:{epp.ports['grpc']}", f"-o={config}"]) == 0
        assert "type: STRICT_DNS" in config.read_text()
        assert await served_through(config, epp.ports["grpc"]) == 200
