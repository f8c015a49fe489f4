"""The token producer in the simulator: a configuration whose token-producer
tokenizes sees each request `pool.token_producer_ms` after it arrived (the
render round trip before the core is offered it); the others see it at once,
and the client's TTFT counts the wait."""

from pathlib import Path

import pytest

from epp.config.loader import EppConfig, load_config
from epp.sim.engine import Simulation
from epp.sim.runner import keeps_prefix_store, tokenizes
from epp.sim.scenario_file import ScenarioError, parse_scenario
from epp.sim.workload import Arrived
from tests.unit.sim.test_sim_gateway_path import PREFILL_S, STEP_S, Direct, document

ROOT = Path(__file__).resolve().parents[3]


class Recording(Direct):
    def arrive(self, request, now):
        self.told.append(("arrive", None, now))
        super().arrive(request, now)


def run(token_producer_ms, tokenizing: bool):
    raw = document(0)
    raw["pool"]["token_producer_ms"] = token_producer_ms
    sim = Simulation(
        parse_scenario(raw), [Arrived(0.5, 0, 100, 5)], lambda _: (1.0, 1.0), tokenizes=tokenizing
    )
    policy = Recording(sim)
    sim.run(policy)
    return sim, policy


def test_a_tokenizing_policy_sees_a_request_the_token_producers_wait_after_it_arrived():
    sim, policy = run({"median": 40}, tokenizing=True)
    assert policy.told[0] == ("arrive", None, pytest.approx(0.54))
    assert sim.requests[0].first_token_at == pytest.approx(0.54 + PREFILL_S + STEP_S)
    assert sim.requests[0].arrival == 0.5  # the client's TTFT counts the wait


def test_a_policy_that_does_not_tokenize_sees_a_request_as_it_arrives():
    _, policy = run({"median": 40}, tokenizing=False)
    assert policy.told[0] == ("arrive", None, 0.5)


def test_the_precise_configuration_tokenizes_and_the_default_does_not():
    assert tokenizes(load_config(ROOT / "config" / "epp" / "precise-prefix.yaml"))
    assert not tokenizes(EppConfig())


def test_a_p90_below_the_median_is_an_error_naming_its_field():
    raw = document(0)
    raw["pool"]["token_producer_ms"] = {"median": 5, "p90": 2}
    with pytest.raises(ScenarioError, match=r"pool\.token_producer_ms\.p90"):
        parse_scenario(raw)


def run_with_store(arrivals, prefix_tokens=64):
    raw = document(0)
    raw["pool"]["token_producer_ms"] = {"median": 40}
    raw["pool"]["token_store_ms"] = {"median": 1}
    raw["tenants"][0]["prefix"] = {"group": "system", "tokens": prefix_tokens}
    sim = Simulation(
        parse_scenario(raw), arrivals, lambda _: (1.0, 1.0), tokenizes=True, token_store=True
    )
    policy = Recording(sim)
    sim.run(policy)
    return [at for kind, _, at in policy.told if kind == "arrive"]


def test_a_prompt_the_token_store_covers_waits_the_stores_wait():
    # the store's blocks are 64 tokens: the second prompt's first 128 tokens
    # (the tenant's system prompt) are held, 80% of it
    offered = run_with_store([Arrived(0.5, 0, 150, 5), Arrived(1.5, 0, 160, 5)], 128)
    assert offered == [pytest.approx(0.54), pytest.approx(1.501)]


def test_a_prompt_whose_first_block_the_token_store_holds_waits_the_stores_wait_too():
    # 64 of its 100 tokens held: its rest is encoded after it is routed
    offered = run_with_store([Arrived(0.5, 0, 100, 5), Arrived(1.5, 0, 100, 5)])
    assert offered == [pytest.approx(0.54), pytest.approx(1.501)]


def test_a_prompt_shorter_than_a_store_block_waits_the_whole_encode():
    offered = run_with_store([Arrived(0.5, 0, 40, 5), Arrived(1.5, 0, 40, 5)])
    assert offered == [pytest.approx(0.54), pytest.approx(1.54)]


def test_the_local_backend_keeps_a_prefix_store_and_the_render_backend_does_not():
    assert keeps_prefix_store(load_config(ROOT / "config" / "epp" / "precise-prefix-local.yaml"))
    assert not keeps_prefix_store(load_config(ROOT / "config" / "epp" / "precise-prefix.yaml"))
