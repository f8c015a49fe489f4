"""The simulator's targets on shortened scenarios, and the command."""

import dataclasses
import json
from pathlib import Path

import pytest

from epp.cli import main
from epp.config.loader import load_config
from epp.sim.report import build_report
from epp.sim.runner import run_scenario
from epp.sim.scenario import PathDelay
from epp.sim.scenario_file import load_scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "config" / "scenarios"


def report_of(name, duration_s=None, **changes):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    duration_s = duration_s or scenario.duration_s
    scenario = dataclasses.replace(scenario, duration_s=duration_s, **changes)
    return build_report(run_scenario(scenario))["policies"]


def without_gateway_path(scenario):
    """`scenario` with its servers talking to the EPP directly: the targets
    below were set for that pool; with the measured Envoy + EPP path they
    miss (bench/README.md, "The gateway path in the simulator")."""
    pool = dataclasses.replace(scenario.pool, request_path=PathDelay(), response_path=PathDelay())
    return dataclasses.replace(scenario, pool=pool)


@pytest.fixture(scope="module")
def overload():
    return report_of("overload-three-tiers", 60.0, baselines=("round-robin",))


def test_overload_keeps_the_top_tier_isolated_under_ours(overload):
    assert overload["epp"]["objectives"]["premium"]["isolation_p99"] <= 1.5


def test_overload_does_not_isolate_the_top_tier_under_round_robin(overload):
    assert overload["round-robin"]["objectives"]["premium"]["isolation_p99"] > 5


def test_same_seed_same_results(overload):
    again = report_of("overload-three-tiers", 60.0, baselines=("round-robin",))
    assert again == overload


@pytest.fixture(scope="module")
def unequal():
    return report_of("unequal-tenants", 60.0)


def test_vtc_shares_token_service_within_its_bound(unequal):
    band = unequal["epp"]["bands"]["0"]
    assert band["jain"] >= 0.99
    assert band["max_service_diff"] <= band["vtc_bound"]


def test_vtc_shares_token_service_with_the_default_config_too():
    # The VTC bound is the guarantee, held on every seed. The Jain index is
    # judged on the mean of twelve seeds: with the servers at full batch one
    # run's index moves by about 0.005 with any change to when requests go.
    default = load_config(SCENARIOS.parent / "epp" / "default.yaml")
    scenario = load_scenario(SCENARIOS / "unequal-tenants.yaml")
    scenario = dataclasses.replace(
        without_gateway_path(scenario),
        duration_s=60.0,
        baselines=(),
        variants=(),
        epp_config=default,
        epp_config_path=None,
    )
    bands = [
        build_report(run_scenario(dataclasses.replace(scenario, seed=seed)))["policies"]["epp"][
            "bands"
        ]["0"]
        for seed in range(1, 13)
    ]
    assert sum(band["jain"] for band in bands) / len(bands) >= 0.985
    assert all(band["max_service_diff"] <= band["vtc_bound"] for band in bands)


@pytest.mark.parametrize("other", ["epp-round-robin", "epp-fcfs", "round-robin"])
def test_vtc_is_fairer_than(unequal, other):
    ours, theirs = unequal["epp"]["bands"]["0"], unequal[other]["bands"]["0"]
    assert ours["jain"] > theirs["jain"]
    assert ours["max_service_diff"] < theirs["max_service_diff"]


def test_with_the_concurrency_gate_no_server_queue_exceeds_its_limit():
    policies = report_of("burst", 40.0, baselines=("round-robin",), isolation=False)
    ours = policies["epp"]
    assert ours["server_waiting_max"] <= ours["server_waiting_limit"]
    assert ours["server_rejections"] == 0
    assert policies["round-robin"]["server_rejections"] > 0


def test_simulate_prints_the_report_and_writes_json(tmp_path, capsys):
    scenario = tmp_path / "unloaded.yaml"
    text = (SCENARIOS / "unloaded.yaml").read_text().replace("duration_s: 120", "duration_s: 10")
    scenario.write_text(
        text.replace("../epp/default.yaml", str(SCENARIOS.parent / "epp" / "default.yaml"))
    )
    out = tmp_path / "report.json"
    assert main(["simulate", str(scenario), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "== epp" in printed and "== round-robin" in printed and "== least-queue" in printed
    report = json.loads(out.read_text())
    assert report["scenario"]["name"] == "unloaded"
    assert "ttft_p99_s" in report["policies"]["epp"]["objectives"]["standard"]


def test_simulate_reports_a_bad_scenario_by_path(tmp_path, capsys):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("name: x\nduration_s: 1\npool: {servers: 1, colour: red}\ntenants: []\n")
    assert main(["simulate", str(scenario)]) == 2
    assert "pool.colour: unknown field" in capsys.readouterr().err


@pytest.fixture(scope="module")
def prefix_heavy():
    return report_of("prefix-heavy", 40.0, baselines=("round-robin",))


def test_prefix_heavy_ours_hits_the_prefix_cache_more_than_round_robin(prefix_heavy):
    ours, theirs = prefix_heavy["epp"], prefix_heavy["round-robin"]
    assert ours["prefix_cache_hit_rate"] > theirs["prefix_cache_hit_rate"]


def test_prefix_heavy_ours_has_a_lower_median_ttft_than_round_robin(prefix_heavy):
    ours = prefix_heavy["epp"]["objectives"]["standard"]
    theirs = prefix_heavy["round-robin"]["objectives"]["standard"]
    assert ours["ttft_p50_s"] < theirs["ttft_p50_s"]


# -- the adaptive gate, with the shipped default configuration ---------------


@pytest.fixture(scope="module", params=["adaptive-uniform", "adaptive-heterogeneous"])
def adaptive(request):
    """A shipped three-tier overload scenario, as shipped (default config)."""
    return report_of(request.param, baselines=("round-robin",))


def test_adaptive_keeps_the_top_tier_within_twice_its_unloaded_p99(adaptive):
    assert adaptive["epp"]["objectives"]["premium"]["isolation_p99"] <= 2.0


@pytest.mark.parametrize("seed", [3, 4])
def test_adaptive_isolates_the_top_tier_on_other_seeds_of_the_uniform_pool(seed):
    # Seeds on which every endpoint probing at once left the top tier no slot.
    policies = report_of("adaptive-uniform", seed=seed, baselines=())
    assert policies["epp"]["objectives"]["premium"]["isolation_p99"] <= 2.0


def test_adaptive_serves_at_least_95_percent_of_round_robins_tokens(adaptive):
    assert adaptive["epp"]["tokens_per_s"] >= 0.95 * adaptive["round-robin"]["tokens_per_s"]


def test_adaptive_keeps_the_queue_in_the_epp(adaptive):
    assert adaptive["epp"]["server_waiting_max"] <= 2


def test_adaptive_limits_settle_within_10_s_of_the_load(adaptive):
    assert adaptive["epp"]["limit_settled_s"] <= 10.0


AS_FAST_AS_ROUND_ROBIN = {
    # scenario: (share of round-robin's throughput at least, {TTFT: at most x round-robin's})
    "short-requests": (0.97, {"ttft_p50_s": 2.0}),  # shorter than the scrape interval
    "whole-responses": (0.99, {"ttft_p50_s": 1.25, "ttft_p99_s": 4.0}),  # p99 seeds 1-5: 1.9-2.7
}
"""Shipped scenarios below the pool's capacity, run with the default config."""


@pytest.fixture(scope="module", params=list(AS_FAST_AS_ROUND_ROBIN))
def below_capacity_as_shipped(request):
    """Ours, round-robin's and the targets of a scenario of AS_FAST_AS_ROUND_ROBIN."""
    policies = report_of(request.param)
    return policies["epp"], policies["round-robin"], AS_FAST_AS_ROUND_ROBIN[request.param]


def test_below_capacity_requests_are_served_at_the_offered_rate(below_capacity_as_shipped):
    ours, round_robin, (share, _) = below_capacity_as_shipped
    assert ours["throughput_rps"] >= share * round_robin["throughput_rps"]


def test_below_capacity_requests_wait_about_as_long_as_round_robin(below_capacity_as_shipped):
    ours, round_robin, (_, waits) = below_capacity_as_shipped
    ours, theirs = ours["objectives"]["standard"], round_robin["objectives"]["standard"]
    for key, factor in waits.items():
        assert ours[key] <= factor * theirs[key], key


def test_adaptive_learns_each_servers_batch_size():
    uniform = report_of("adaptive-uniform", 30.0, baselines=(), isolation=False)
    assert set(uniform["epp"]["learned_limits"].values()) == {16}
    mixed = report_of("adaptive-heterogeneous", 30.0, baselines=(), isolation=False)
    limits = mixed["epp"]["learned_limits"]
    assert [limits[f"server-{i}"] for i in range(4)] == [8, 8, 32, 32]
    assert 64 < limits["server-4"] < 256  # its KV cache holds fewer than it may batch


def test_adaptive_follows_a_server_that_slows_down_and_shrinks():
    policies = report_of("adaptive-slowdown", 60.0, baselines=(), isolation=False)
    ours = policies["epp"]
    assert ours["learned_limits"] == {
        "server-0": 32,
        "server-1": 12,
        "server-2": 32,
        "server-3": 32,
    }
    assert ours["limit_settled_s"] <= 40.0 + 10.0  # the change comes at 40 s


@pytest.fixture(scope="module")
def slow_no_queue():
    scenario = load_scenario(SCENARIOS / "adaptive-slow-no-queue.yaml")
    run = run_scenario(dataclasses.replace(scenario, baselines=("round-robin",)))
    return run, build_report(run)["policies"]


def test_adaptive_holds_fewer_requests_on_a_server_that_slowed_without_queueing(slow_no_queue):
    _, policies = slow_no_queue
    ours = policies["epp"]
    limits = ours["learned_limits"]
    assert limits["server-1"] < 0.6 * 32  # three times slower from 40 s
    assert [limits[f"server-{i}"] for i in (0, 2, 3)] == [32, 32, 32]
    assert ours["objectives"]["premium"]["isolation_p99"] <= 2.0
    assert ours["tokens_per_s"] >= 0.95 * policies["round-robin"]["tokens_per_s"]
    assert ours["server_waiting_max"] <= 2


def test_adaptive_lowers_the_limit_of_a_server_that_slowed_without_queueing_within_10_s(
    slow_no_queue,
):
    sim = slow_no_queue[0].runs["epp"]
    slowed = sim.addresses[1]  # three times slower from 40 s, its batch unchanged
    lowered = next(
        when
        for when, limits in zip(sim.samples.times, sim.samples.limits, strict=True)
        if when >= 40.0 and limits.get(slowed, 32) < 0.6 * 32
    )
    assert lowered <= 40.0 + 10.0


def test_overload_keeps_the_top_tier_isolated_with_the_default_config_too():
    default = load_config(SCENARIOS.parent / "epp" / "default.yaml")
    policies = report_of(
        "overload-three-tiers", 60.0, baselines=(), epp_config=default, epp_config_path=None
    )
    assert policies["epp"]["objectives"]["premium"]["isolation_p99"] <= 1.5


def below_capacity(stream: bool) -> dict:
    """Eight servers at 200 req/s of short requests: about half of what they
    can serve, and four requests per endpoint per scrape interval."""
    tenant = {
        "objective": "standard",
        "rate_rps": 50,
        "arrival": "poisson",
        "prompt_tokens": {"uniform": [100, 400]},
        "output_tokens": {"uniform": [10, 40]},
        "stream": stream,
    }
    document = {
        "name": "below-capacity",
        "seed": 1,
        "duration_s": 30,
        "pool": {
            "servers": 8,
            "max_num_seqs": 32,
            "prefill_ms_per_token": 0.05,
            "decode_ms_per_token": 5,
        },
        "objectives": [{"name": "standard", "priority": 0}],
        "tenants": [{"name": f"t{i}", **tenant} for i in range(4)],
        "baselines": ["round-robin"],
        "isolation": False,
    }
    return build_report(run_scenario(parse_scenario(document)))["policies"]


def test_adaptive_admits_streamed_requests_as_fast_as_they_come_below_capacity():
    policies = below_capacity(stream=True)
    ours = policies["epp"]["objectives"]["standard"]["ttft_p99_s"]
    assert ours <= 2 * policies["round-robin"]["objectives"]["standard"]["ttft_p99_s"]


def test_whole_responses_near_capacity_wait_about_as_long_as_round_robin():
    """Eight servers at 300 req/s of whole responses: more than one request
    per endpoint per scrape interval, so a queue caught between two steps is
    common and must not pace the servers to one request per sample."""
    scenario = without_gateway_path(load_scenario(SCENARIOS / "whole-responses.yaml"))
    tenants = tuple(dataclasses.replace(tenant, rate_rps=75) for tenant in scenario.tenants)
    policies = build_report(run_scenario(dataclasses.replace(scenario, tenants=tenants)))[
        "policies"
    ]
    ours, round_robin = policies["epp"], policies["round-robin"]
    assert ours["throughput_rps"] >= 0.99 * round_robin["throughput_rps"]
    ours, round_robin = ours["objectives"]["standard"], round_robin["objectives"]["standard"]
    assert ours["ttft_p50_s"] <= 1.5 * round_robin["ttft_p50_s"]  # 1.23x (seed 1)
    assert ours["ttft_p99_s"] <= 4 * round_robin["ttft_p99_s"]  # 3.10x
