"""Pool events in the simulator's loop."""

from pathlib import Path

import yaml

from epp.sim.runner import simulate
from epp.sim.scenario import parse_scenario
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
ONE_AT_A_TIME = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  gate: {kinds: [concurrency], maxPerEndpoint: 1}
"""


def test_a_request_queued_in_the_epp_expires_at_its_deadline_not_at_the_next_event(tmp_path):
    config = tmp_path / "epp.yaml"
    config.write_text(ONE_AT_A_TIME)
    scenario = parse_scenario(yaml.safe_load(EXPIRING.replace("CONFIG", str(config))), ROOT)
    sim = simulate(scenario, workload(scenario), "epp")
    expired = [r for r in sim.requests if r.outcome == "rejected-ttl-expired"]
    assert expired
    assert all(abs(r.finished_at - (r.arrival + 0.3)) < 1e-9 for r in expired)
