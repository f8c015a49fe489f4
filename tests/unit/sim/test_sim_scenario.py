"""Scenario files: the issue's example parses; errors name their path."""

from pathlib import Path

import pytest
import yaml

from epp.sim.scenario_file import ScenarioError, load_scenario, parse_scenario
from epp.sim.workload import workload

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = [
    ROOT / "config" / "scenarios" / f"{name}.yaml"
    for name in (
        "unloaded",
        "overload-three-tiers",
        "unequal-tenants",
        "burst",
        "server-failure",
        "prefix-heavy",
        "adaptive-uniform",
        "adaptive-heterogeneous",
        "adaptive-slowdown",
        "adaptive-slow-no-queue",
        "pd-long-prompts",
        "pd-short-prompts",
        "pd-prefix-heavy",
        "eviction",
        "pd-prefill-timeout",
        "precise-multiturn",
        "precise-system-prompts",
        "precise-restarts",
        "precise-chat-restarts",
        "precise-mispredict",
        "precise-demo",
    )
] + sorted((ROOT / "bench" / "scenarios").glob("*.yaml"))
EXAMPLE = """  # noqa: E501 (the issue's example, verbatim)
name: overload-three-tiers
seed: 7
duration_s: 300
pool: {servers: 8, max_num_seqs: 32, prefill_ms_per_token: 0.2, decode_ms_per_token: 12, kv_blocks: 8000, block_size: 16}
objectives: [{name: premium, priority: 10}, {name: standard, priority: 0}, {name: batch, priority: -5}]
tenants:
  - {name: a, objective: premium, rate_rps: 5, arrival: poisson, prompt_tokens: {lognormal: {mean: 600, sigma: 0.6}}, output_tokens: {constant: 200}}
  - {name: b, objective: standard, rate_rps: 20, arrival: poisson, prompt_tokens: {uniform: [100, 2000]}, output_tokens: {uniform: [50, 500]}}
events: [{at_s: 120, server_down: 3}]
epp: {config: config/epp/default.yaml}
baselines: [round-robin, least-queue]
"""


def errors_of(document):
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(document, ROOT)
    return caught.value.errors


def test_the_example_of_the_issue_parses_as_written():
    scenario = parse_scenario(yaml.safe_load(EXAMPLE), ROOT)
    assert (scenario.pool.servers, len(scenario.tenants), scenario.events[0].server) == (8, 2, 3)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_scenario_parses(path):
    assert load_scenario(path).tenants


def test_an_unknown_key_is_an_error_naming_its_path():
    document = yaml.safe_load(EXAMPLE)
    document["tenants"][1]["colour"] = "red"
    assert errors_of(document) == ["tenants[1].colour: unknown field"]


def test_a_bad_distribution_is_an_error_naming_its_path():
    document = yaml.safe_load(EXAMPLE)
    document["tenants"][0]["prompt_tokens"] = {"uniform": [500, 100]}
    assert errors_of(document)[0].startswith("tenants[0].prompt_tokens.uniform:")


def test_an_event_naming_a_missing_server_is_an_error():
    document = yaml.safe_load(EXAMPLE)
    document["events"][0]["server_down"] = 8
    assert errors_of(document) == ["events[0].server_down: must name a server in 0..7"]


def test_the_same_seed_draws_the_same_workload_and_another_seed_does_not():
    document = yaml.safe_load(EXAMPLE)
    first = workload(parse_scenario(document, ROOT))
    assert workload(parse_scenario(document, ROOT)) == first
    document["seed"] = 8
    assert workload(parse_scenario(document, ROOT)) != first


HETEROGENEOUS = """
name: mixed
duration_s: 10
pool:
  decode_ms_per_token: 15
  groups:
    - {servers: 2, max_num_seqs: 8, decode_ms_per_token: 20}
    - {servers: 1, max_num_seqs: 256}
objectives: [{name: standard, priority: 0}]
tenants: [{name: a, objective: standard, rate_rps: 1, prompt_tokens: 100, output_tokens: 10}]
events: [{at_s: 5, server_change: 2, params: {max_num_seqs: 12}}]
"""


def test_a_pool_of_groups_numbers_its_servers_across_the_groups_in_order():
    pool = parse_scenario(yaml.safe_load(HETEROGENEOUS), ROOT).pool
    assert pool.servers == 3
    assert [p.max_num_seqs for p in pool.server_params] == [8, 8, 256]


def test_a_group_takes_the_pools_server_keys_it_does_not_set():
    pool = parse_scenario(yaml.safe_load(HETEROGENEOUS), ROOT).pool
    assert [p.decode_ms_per_token for p in pool.server_params] == [20, 20, 15]


def test_a_server_change_keeps_the_servers_other_parameters():
    event = parse_scenario(yaml.safe_load(HETEROGENEOUS), ROOT).events[0]
    assert (event.server, event.params.max_num_seqs, event.params.decode_ms_per_token) == (
        2,
        12,
        15,
    )


def test_servers_beside_groups_is_an_error():
    document = yaml.safe_load(HETEROGENEOUS)
    document["pool"]["servers"] = 4
    assert errors_of(document) == ["pool.servers: give servers per group when the pool has groups"]


def test_a_group_with_an_unknown_key_is_an_error_naming_its_path():
    document = yaml.safe_load(HETEROGENEOUS)
    document["pool"]["groups"][1]["colour"] = "red"
    assert errors_of(document) == ["pool.groups[1].colour: unknown field"]


def test_a_server_change_needs_params_and_only_it_takes_them():
    document = yaml.safe_load(HETEROGENEOUS)
    document["events"] = [
        {"at_s": 1, "server_change": 0},
        {"at_s": 2, "server_down": 0, "params": {"max_num_seqs": 4}},
    ]
    assert errors_of(document) == [
        "events[0].params: needs at least one server key",
        "events[1].params: only a server_change takes params",
    ]
