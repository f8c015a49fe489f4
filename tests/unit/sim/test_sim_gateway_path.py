"""The Envoy + EPP path in the simulator: a dispatched request reaches its
server the request path's delay later, and its first token and end reach
the client and the policy the response path's delay after the server wrote
them; `pool.path_ms` sets both legs (lognormal by median and p90)."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.sim.engine import Simulation
from epp.sim.requests import COMPLETED, EVICTED
from epp.sim.scenario import REQUEST_PATH, RESPONSE_PATH, PathDelay
from epp.sim.scenario_file import ScenarioError, parse_scenario
from epp.sim.workload import Arrived

STEP_S = 0.020
PREFILL_S = (10 + 0.5 * 100) / 1000


def document(path_ms=None) -> dict:
    pool = {
        "servers": 1,
        "max_num_seqs": 8,
        "prefill_ms_per_token": 0.5,
        "prefill_overhead_ms": 10,
        "decode_ms_per_token": 20,
        "decode_batch_growth": 0.0,
    }
    if path_ms is not None:
        pool["path_ms"] = path_ms
    return {
        "name": "path",
        "duration_s": 5,
        "pool": pool,
        "objectives": [{"name": "standard", "priority": 0}],
        "tenants": [
            {"name": "a", "objective": "standard", "rate_rps": 1, "prompt_tokens": 100,
             "output_tokens": 5}
        ],
        "baselines": [],
    }  # fmt: skip


class Direct:
    """Sends every request to server 0 at once; records what it is told."""

    def __init__(self, sim, evict_at=None):
        self.sim = sim
        self.evict_at = evict_at
        self.told = []

    def arrive(self, request, now):
        self.sim.send(request, 0, now)
        self.request = request
        if self.evict_at is not None:
            self.sim.want_timer(now + self.evict_at)

    def finished(self, request, now):
        self.told.append(("finished", request.outcome, now))

    def first_token(self, request, now):
        self.told.append(("first_token", None, now))

    def pool_changed(self, now):
        pass

    def prefill_done(self, request, now):
        pass

    def timer(self, now):
        self.sim.evict(self.request, now)

    def kv_events(self, address, events):
        pass

    def queued_by_priority(self):
        return {}

    def limits(self):
        return {}


def run(path_ms, evict_at=None):
    scenario = parse_scenario(document(path_ms))
    sim = Simulation(scenario, [Arrived(0.0, 0, 100, 5)], lambda _: (1.0, 1.0))
    policy = Direct(sim, evict_at)
    sim.run(policy)
    return sim, policy


def test_a_request_reaches_its_server_the_request_path_later():
    sim, _ = run({"request": {"median": 8}, "response": {"median": 0}})
    request = sim.requests[0]
    assert request.batched_at == pytest.approx(0.008)
    assert request.first_token_at == pytest.approx(0.008 + PREFILL_S + STEP_S)


def test_the_client_and_the_policy_see_first_token_and_end_the_response_path_later():
    sim, policy = run({"request": {"median": 0}, "response": {"median": 4}})
    request = sim.requests[0]
    server_first = PREFILL_S + STEP_S
    server_end = server_first + 4 * STEP_S
    assert request.first_token_at == pytest.approx(server_first + 0.004)
    assert request.finished_at == pytest.approx(server_end + 0.004)
    assert policy.told == [
        ("first_token", None, pytest.approx(server_first + 0.004)),
        ("finished", COMPLETED, pytest.approx(server_end + 0.004)),
    ]


def test_no_path_gives_the_servers_times():
    sim, _ = run(0)
    request = sim.requests[0]
    assert request.batched_at == 0.0
    assert request.first_token_at == pytest.approx(PREFILL_S + STEP_S)


def test_a_request_evicted_on_its_way_never_reaches_its_server():
    sim, policy = run({"request": {"median": 8}, "response": {"median": 0}}, evict_at=0.004)
    request = sim.requests[0]
    assert request.outcome == EVICTED
    assert request.batched_at is None
    assert sim.servers[0].prompt_tokens == 0
    assert policy.told == [("finished", EVICTED, pytest.approx(0.004))]


def test_the_default_path_is_the_measured_one():
    pool = parse_scenario(document()).pool
    assert (pool.request_path, pool.response_path) == (REQUEST_PATH, RESPONSE_PATH)
    assert REQUEST_PATH and RESPONSE_PATH


def test_a_p90_below_the_median_is_an_error_naming_its_path():
    with pytest.raises(ScenarioError, match=r"pool\.path_ms\.request\.p90"):
        parse_scenario(document({"request": {"median": 5, "p90": 3}}))


def test_an_unknown_leg_is_an_error():
    with pytest.raises(ScenarioError, match=r"pool\.path_ms\.upstream: unknown field"):
        parse_scenario(document({"upstream": {"median": 5}}))


@given(
    median=st.floats(0.5, 50.0),
    spread=st.floats(1.0, 4.0),
    seed=st.integers(0, 2**32),
)
def test_draws_have_the_median_and_p90_they_are_given(median, spread, seed):
    delay = PathDelay(median, median * spread)
    rng = random.Random(seed)
    draws = sorted(delay.draw(rng) * 1000 for _ in range(4000))
    assert draws[2000] == pytest.approx(median, rel=0.1)
    assert draws[3600] == pytest.approx(median * spread, rel=0.12)
    assert all(d > 0 for d in draws)
