"""The simulator runs what `epp serve` runs: every reference sample that
serve loads, eviction (the evicted request ends `evicted` and its credit
returns once), admitter plugins and the prefill deadline."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from epp.sim.engine import Simulation
from epp.sim.policies import ADMISSION_DENIED
from epp.sim.requests import EVICTED
from epp.sim.runner import simulate
from epp.sim.scenario import Scenario
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload
from tests.support.disagg import DISAGG_SCHEDULING
from tests.unit.config.test_reference_configs import LOADING, SAMPLES

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def tenant(name: str, rate: float, output_tokens: int) -> dict:
    """A Poisson tenant of objective `name`, 200-token prompts."""
    return {
        "name": name,
        "objective": name,
        "rate_rps": rate,
        "arrival": "poisson",
        "prompt_tokens": {"constant": 200},
        "output_tokens": {"constant": output_tokens},
    }


TWO_TIERS = {
    "objectives": [{"name": "premium", "priority": 10}, {"name": "batch", "priority": -5}],
    "tenants": [tenant("batch", 8, 400), tenant("premium", 2, 50)],
}
POOL = {"servers": 2, "max_num_seqs": 8, "decode_ms_per_token": 10}


def scenario(config: Path, **document) -> Scenario:
    return parse_scenario(
        {
            "name": "t",
            "seed": 3,
            "duration_s": 10,
            "drain_s": 60,
            "isolation": False,
            "pool": POOL,
            "baselines": [],
            "epp": {"config": str(config)},
            **TWO_TIERS,
            **document,
        }
    )


def run(config: Path, **document) -> Simulation:
    loaded = scenario(config, **document)
    return simulate(loaded, workload(loaded), "epp")


def outcomes(sim: Simulation) -> Counter[str]:
    return Counter(request.outcome for request in sim.requests)


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "epp.yaml"
    path.write_text(HEAD + text)
    return path


@pytest.mark.parametrize("sample", sorted(LOADING))
def test_a_reference_sample_that_serve_loads_runs_in_the_simulator(sample: str) -> None:
    sim = run(SAMPLES / sample, duration_s=2)
    assert sim.requests and all(request.outcome is not None for request in sim.requests)


def test_an_evicted_request_ends_evicted_and_its_credit_returns_once(tmp_path) -> None:
    config = config_file(
        tmp_path,
        "flowControl:\n  enableEviction: true\n  gate: {kinds: [concurrency], maxPerEndpoint: 4}\n",
    )
    sim = run(config)
    ended = outcomes(sim)
    assert ended[EVICTED] > 0
    assert {r.tenant for r in sim.requests if r.outcome == EVICTED} == {0}  # batch only
    core = sim.policy.core  # type: ignore[union-attr]
    assert core.in_flight == 0 and core.credits.in_flight == 0
    assert sum(ended.values()) == len(sim.requests) and "unfinished" not in ended


def test_without_eviction_nothing_is_evicted(tmp_path) -> None:
    config = config_file(
        tmp_path, "flowControl:\n  gate: {kinds: [concurrency], maxPerEndpoint: 4}\n"
    )
    assert outcomes(run(config))[EVICTED] == 0


def test_the_admitter_refuses_sheddable_arrivals_on_a_saturated_pool() -> None:
    # The sample's gate never closes, so the servers' queues fill and
    # saturate the pool for the admitter.
    sim = run(SAMPLES / "probabilistic-admitter-epp-config.yaml")
    denied = [request.tenant for request in sim.requests if request.outcome == ADMISSION_DENIED]
    assert denied and set(denied) == {0}  # the batch tier, never premium


def pd_run(tmp_path: Path, timeout: str) -> Simulation:
    config = config_file(
        tmp_path,
        "flowControl:\n"
        f"  gate: {{kinds: [concurrency], maxPerEndpoint: 8, maxPerPrefillEndpoint: 2,"
        f" prefillTimeout: {timeout}}}\n" + DISAGG_SCHEDULING,
    )
    slow_prefill = {
        **POOL,
        "servers": 3,
        "prefill_ms_per_token": 5,
        "roles": {"prefill": 1, "decode": 2},
    }
    return run(
        config,
        pool=slow_prefill,
        objectives=[{"name": "premium", "priority": 10}],
        tenants=[{**tenant("premium", 4, 50), "prompt_tokens": {"constant": 400}}],
    )


def test_prefill_credits_come_back_at_the_deadline_in_the_simulator(tmp_path) -> None:
    # Each prefill takes 2 s; two credits keep at most two legs at the
    # prefill server, unless the deadline hands the credits back first.
    held = pd_run(tmp_path, "60s")
    deadline = pd_run(tmp_path, "500ms")
    assert held.servers[0].max_waiting_seen <= 2 < deadline.servers[0].max_waiting_seen
