"""Pool events in the simulator's loop."""

from pathlib import Path

import yaml

from epp.sim.runner import simulate
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = """
name: change
duration_s: 4
pool: {groups: [{servers: 1, max_num_seqs: 8}, {servers: 1, max_num_seqs: 32}]}
objectives: [{name: standard, priority: 0}]
tenants: [{name: a, objective: standard, rate_rps: 20, prompt_tokens: 100, output_tokens: 50}]
events: [{at_s: 1, server_change: 1, params: {max_num_seqs: 2, decode_ms_per_token: 40}}]
"""


def test_a_server_change_applies_its_parameters_from_that_moment_on():
    scenario = parse_scenario(yaml.safe_load(SCENARIO), ROOT)
    sim = simulate(scenario, workload(scenario), "round-robin")
    changed = sim.servers[1]
    assert (changed.params.max_num_seqs, changed.params.decode_ms_per_token) == (2, 40)
    assert sim.servers[0].params.max_num_seqs == 8
    late = [r for r in sim.requests if r.server == 1 and r.started_at and r.started_at > 1.5]
    assert late and all(
        r.finished_at - r.first_token_at >= 0.040 * (r.output_tokens - 1) for r in late
    )


EXPIRING = """
name: expiring
seed: 1
duration_s: 6
pool: {servers: 1, max_num_seqs: 1, decode_ms_per_token: 12}
objectives: [{name: standard, priority: 0}]
tenants:
  - {name: a, objective: standard, rate_rps: 2, ttl_s: 0.3, prompt_tokens: 100, output_tokens: 200}
epp: {config: CONFIG}
baselines: []
"""
FIXED = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  gate: {kinds: [concurrency], maxPerEndpoint: LIMIT}
"""
ONE_AT_A_TIME = FIXED.replace("LIMIT", "1")


def test_a_request_queued_in_the_epp_expires_at_its_deadline_not_at_the_next_event(tmp_path):
    config = tmp_path / "epp.yaml"
    config.write_text(ONE_AT_A_TIME)
    scenario = parse_scenario(yaml.safe_load(EXPIRING.replace("CONFIG", str(config))), ROOT)
    sim = simulate(scenario, workload(scenario), "epp")
    expired = [r for r in sim.requests if r.outcome == "rejected-ttl-expired"]
    assert expired
    assert all(abs(r.finished_at - (r.arrival + 0.3)) < 1e-9 for r in expired)


HELD_BACK = """
name: held-back
seed: 1
duration_s: 5
pool: {servers: 1, max_num_seqs: 8, decode_ms_per_token: 12, path_ms: 0}
objectives: [{name: standard, priority: 0}]
tenants: [{name: a, objective: standard, rate_rps: 100, prompt_tokens: 100, output_tokens: 100}]
epp: {config: CONFIG}
baselines: []
"""


def idle_capacity(tmp_path, policy: str, limit: int) -> tuple[float, float]:
    config = tmp_path / "epp.yaml"
    config.write_text(FIXED.replace("LIMIT", str(limit)))
    scenario = parse_scenario(yaml.safe_load(HELD_BACK.replace("CONFIG", str(config))), ROOT)
    sim = simulate(scenario, workload(scenario), policy, measure_idle=True)
    return sim.idle.seconds[0], sim.idle.longest_s[0]


def test_a_server_held_below_its_batch_while_the_epp_queues_idles_capacity(tmp_path):
    idle, longest = idle_capacity(tmp_path, "epp", 2)
    assert idle > 30.0  # the EPP queues from the first second until its TTLs end the queue
    assert longest > 1.0


def test_a_server_kept_at_its_batch_idles_no_capacity(tmp_path):
    idle, _ = idle_capacity(tmp_path, "epp", 8)
    assert idle < 0.2


def test_a_policy_that_queues_nothing_idles_no_capacity(tmp_path):
    idle, _ = idle_capacity(tmp_path, "round-robin", 8)
    assert idle == 0.0
