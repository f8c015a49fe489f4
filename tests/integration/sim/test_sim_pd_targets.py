"""The P/D scenarios' targets, on the shipped scenarios as written: P/D wins
on long prompts under a tight TPOT SLO, loses little on short prompts, and
the prefix-based decider keeps a prefix-heavy workload mostly local."""

import dataclasses
from pathlib import Path

import pytest

from epp.sim.report import build_report
from epp.sim.runner import run_scenario
from epp.sim.scenario_file import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "config" / "scenarios"


def report_of(name, **changes):
    scenario = dataclasses.replace(load_scenario(SCENARIOS / f"{name}.yaml"), **changes)
    return build_report(run_scenario(scenario))["policies"]


@pytest.fixture(scope="module")
def long_prompts():
    return report_of("pd-long-prompts")


@pytest.fixture(scope="module")
def short_prompts():
    return report_of("pd-short-prompts")


def test_every_policy_reports_goodput_and_its_disaggregated_share(long_prompts):
    assert set(long_prompts) == {"epp", "aggregated", "round-robin"}
    for policy in long_prompts.values():
        assert policy["goodput_rps"] >= 0
        assert 0 <= policy["disaggregated_share"] <= 1
    assert long_prompts["aggregated"]["disaggregated_share"] == 0
    assert long_prompts["round-robin"]["disaggregated_share"] == 0


def test_long_prompts_disaggregated_give_at_least_1_3x_the_goodput_of_aggregated(long_prompts):
    ours, aggregated = long_prompts["epp"], long_prompts["aggregated"]
    assert ours["disaggregated_share"] == 1.0
    assert ours["goodput_rps"] >= 1.3 * aggregated["goodput_rps"]


def test_long_prompts_disaggregated_keep_decode_steps_free_of_prefills(long_prompts):
    ours, aggregated = long_prompts["epp"], long_prompts["aggregated"]
    assert ours["tpot_p99_s"] < aggregated["tpot_p99_s"] / 2


def test_long_prompts_pay_for_it_in_ttft(long_prompts):
    # DistServe's trade: fewer servers prefill, and the KV must move.
    assert long_prompts["epp"]["ttft_p50_s"] > long_prompts["aggregated"]["ttft_p50_s"]


def test_short_prompts_lose_at_most_10_percent_of_goodput(short_prompts):
    ours, aggregated = short_prompts["epp"], short_prompts["aggregated"]
    assert 0 < ours["disaggregated_share"] < 0.2
    assert ours["goodput_rps"] >= 0.9 * aggregated["goodput_rps"]


def test_a_prefix_heavy_workload_stays_mostly_local():
    ours = report_of("pd-prefix-heavy", baselines=())["epp"]
    assert 0 < ours["disaggregated_share"] < 0.1
    assert ours["prefix_cache_hit_rate"] > 0.8
