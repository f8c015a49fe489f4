"""`epp demo --compare`: which policies it plays, and the configuration a
precise run gives the EPP."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from epp.config.loader import load_config
from epp.config.precise import TokenizerBackend
from epp.demo.compare import deployed_config, is_precise, policies, prefix_hit_rate
from epp.demo.model_server import SimulatedServer
from epp.sim.scenario_file import load_scenario
from epp.sim.server_model import ServerParams

ROOT = Path(__file__).resolve().parents[3]
PRECISE = ROOT / "config" / "epp" / "precise-prefix.yaml"


def test_the_policies_are_the_configuration_its_variants_and_round_robin():
    scenario = load_scenario(str(ROOT / "config" / "scenarios" / "precise-demo.yaml"))
    chosen = policies(scenario)
    assert [name for name, _ in chosen] == ["epp", "precise", "round-robin"]
    assert [is_precise(config) for _, config in chosen] == [False, True, False]


def test_a_deployed_precise_config_tokenizes_in_process_and_subscribes_at_the_servers_port(
    tmp_path,
):
    deployed = load_config(deployed_config(PRECISE, tmp_path, "m", 6001, tmp_path / "tokenizer"))
    assert deployed.tokenizer is not None and deployed.kv_events is not None
    assert deployed.tokenizer.backend is TokenizerBackend.LOCAL
    assert deployed.tokenizer.model_dir == str(tmp_path / "tokenizer")
    assert deployed.tokenizer.model_name == "m"
    assert (deployed.kv_events.discover_pods, deployed.kv_events.socket_port) == (True, 6001)


def test_without_a_tokenizer_the_deployed_config_asks_the_render_url(tmp_path):
    deployed = load_config(deployed_config(PRECISE, tmp_path, "m", 6001, None, "http://h:1"))
    assert deployed.tokenizer is not None
    assert deployed.tokenizer.backend is TokenizerBackend.VLLM
    assert deployed.tokenizer.url == "http://h:1"


async def test_the_hit_rate_is_the_servers_cached_prompt_tokens_over_their_prompt_tokens():
    server = SimulatedServer(ServerParams(decode_ms_per_token=1.0))
    port = await server.start()
    body = {"model": "model", "prompt": "y" * (4 * 49), "max_tokens": 2}  # 49 tokens
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body):
                    pass
        rate = await prefix_hit_rate([f"127.0.0.1:{port}"])
    finally:
        await server.stop()
    assert rate == 48 / 98  # the second request finds three blocks of 16 cached
