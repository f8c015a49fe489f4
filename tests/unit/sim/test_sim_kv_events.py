"""The simulated servers' KV-cache events, conversations and restarts in
place, and the precise prefix cache the EPP builds from the events."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from epp.scheduling.kvblocks import BlockRemoved, BlockStored
from epp.sim.blocks import block_keys
from epp.sim.runner import simulate
from epp.sim.scenario_file import parse_scenario
from epp.sim.server_model import ModelServer, ServerParams, ServerRequest
from epp.sim.workload import workload
from tests.unit.sim.test_sim_server_model import Recorder, run_until_idle

ROOT = Path(__file__).resolve().parents[3]
PRECISE = ROOT / "config" / "epp" / "precise-prefix.yaml"
CHAT = """
name: chat
seed: 3
duration_s: 12
pool: {servers: 3, max_num_seqs: 8, kv_blocks: 400, block_size: 16, kv_event_lag_ms: 5}
objectives: [{name: chat, priority: 0}]
tenants:
  - {name: a, objective: chat, rate_rps: 1, prefix: {group: sys, tokens: 320},
     conversation: {turns: 3, think_s: 2}, prompt_tokens: {uniform: [40, 120]},
     output_tokens: {uniform: [20, 60]}}
EVENTS
epp: {config: PRECISE, variants: [{name: approximate, config: DEFAULT}]}
baselines: [round-robin]
"""


RESTART = "events: [{at_s: 6, server_restart: 0}]"


def chat(events: str = "") -> str:
    return (
        CHAT.replace("PRECISE", str(PRECISE))
        .replace("DEFAULT", str(ROOT / "config" / "epp" / "default.yaml"))
        .replace("EVENTS", events)
    )


def test_a_conversations_turns_carry_its_history_and_come_think_s_apart():
    scenario = parse_scenario(yaml.safe_load(chat()), ROOT)
    turns = [r for r in workload(scenario) if r.conversation == 0]
    assert [round(t.time - turns[0].time, 9) for t in turns] == [0, 2, 4]
    for before, after in itertools.pairwise(turns):
        assert after.prompt_tokens > before.prompt_tokens + before.output_tokens


@given(
    st.integers(0, 400),
    st.integers(0, 400),
    st.integers(0, 300),
    st.sampled_from(["same-conversation", "same-prefix", "other-prefix"]),
)
def test_two_prompts_share_a_block_exactly_when_they_share_its_content(
    first, second, prefix, relation
):
    chat = 7 if relation == "same-conversation" else -1
    a = block_keys(16, first, prefix, 0, chat, request=1)
    b = block_keys(16, second, prefix, 1 if relation == "other-prefix" else 0, chat, request=2)
    for index in range(min(len(a), len(b))):
        in_prefix = (index + 1) * 16 <= prefix
        shared = relation == "same-conversation" or (relation == "same-prefix" and in_prefix)
        assert (a[index] == b[index]) == shared


def test_a_server_logs_its_stores_and_evicts_a_prompts_tail_first():
    # 11 blocks run the request, so 9 of the 20 are left for its 10 cached ones
    server = ModelServer(ServerParams(max_num_seqs=4, kv_blocks=20, block_size=16), Recorder())
    server.kv_log = []
    keys = block_keys(16, 160, request=1)
    server.admit(ServerRequest(1, 160, 1, block_keys=keys), 0.0)
    run_until_idle(server)
    assert server.kv_log == [BlockStored(keys, None, (), 16), BlockRemoved(keys[-1:])]


def test_a_restart_in_place_ends_what_the_server_ran_and_keeps_it_in_the_pool():
    scenario = parse_scenario(yaml.safe_load(chat(RESTART)), ROOT)
    sim = simulate(scenario, workload(scenario), "epp")
    assert sim.up == [True, True, True]
    lost = [r for r in sim.requests if r.outcome == "server-failed"]
    assert lost and all(r.server == 0 and r.arrival <= 6 for r in lost)
    assert any(r.server == 0 and r.arrival > 6.5 and r.outcome == "completed" for r in sim.requests)


@pytest.mark.parametrize("events", ["", RESTART], ids=["steady", "restart"])
def test_the_precise_index_holds_what_each_server_holds_once_the_events_arrived(events):
    scenario = parse_scenario(yaml.safe_load(chat(events)), ROOT)
    sim = simulate(scenario, workload(scenario), "epp")
    index = sim.policy.core.kv_index
    assert index is not None and len(index) > 0
    for address, server in zip(sim.addresses, sim.servers, strict=True):
        cached = {key for key in server._cache if isinstance(key, int)}
        assert index.held_by(address) == len(cached)
        assert all(index.holds(address, key) for key in cached)


def test_a_variant_runs_its_own_configuration_file():
    scenario = parse_scenario(yaml.safe_load(chat()), ROOT)
    (variant,) = scenario.variants
    assert variant.config is not None and variant.config.scheduling.precise is None
    assert scenario.epp_config.scheduling.precise is not None
    approximate = simulate(scenario, workload(scenario), "approximate")
    assert approximate.policy.core.kv_index is None
