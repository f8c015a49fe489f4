"""The precise prefix cache's targets on the shipped scenarios:
under KV pressure and where the approximate index cannot see a
conversation's history, precise routing hits the servers' caches more and
its TTFT p90 is lower; without either, both route alike."""

import dataclasses
from pathlib import Path

import pytest

from epp.sim.report import build_report
from epp.sim.runner import run_scenario
from epp.sim.scenario_file import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "config" / "scenarios"


def policies_of(name: str, duration_s: float | None = None) -> dict:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    duration_s = duration_s or scenario.duration_s
    scenario = dataclasses.replace(scenario, duration_s=duration_s, baselines=())
    return build_report(run_scenario(scenario))["policies"]


@pytest.mark.parametrize("name", ["precise-system-prompts", "precise-mispredict"])
def test_precise_routing_hits_more_and_answers_sooner_than_the_approximate_index(name):
    policies = policies_of(name)
    precise, approximate = policies["precise"], policies["epp"]
    assert precise["prefix_cache_hit_rate"] > approximate["prefix_cache_hit_rate"] + 0.02
    assert precise["ttft_p90_s"] < approximate["ttft_p90_s"]


def test_without_evictions_or_hidden_history_both_indexes_route_alike():
    policies = policies_of("precise-multiturn", 30.0)
    precise, approximate = policies["precise"], policies["epp"]
    assert precise["prefix_cache_hit_rate"] == pytest.approx(
        approximate["prefix_cache_hit_rate"], abs=0.01
    )


@pytest.mark.parametrize("name", ["precise-restarts", "precise-chat-restarts"])
def test_across_restarts_precise_routing_hits_as_much_and_its_p90_is_lower(name):
    policies = policies_of(name)
    precise, approximate = policies["precise"], policies["epp"]
    assert precise["prefix_cache_hit_rate"] >= approximate["prefix_cache_hit_rate"]
    assert precise["ttft_p90_s"] < approximate["ttft_p90_s"]
