"""The simulator's prefill/decode model: the sidecar's remote prefill, the KV
transfer, the fallback to a local prefill, roles, SLOs and the report."""

import dataclasses

import pytest
import yaml

from epp.sim.engine import ROLE_LABEL, Simulation
from epp.sim.report import disaggregation_stats, latency_stats, tenant_slos
from epp.sim.requests import COMPLETED, SimRequest
from epp.sim.scenario import KvTransfer, ServerEvent
from epp.sim.scenario_file import ScenarioError, parse_scenario
from epp.sim.server_model import ModelServer, ServerParams, ServerRequest
from epp.sim.workload import Arrived

PARAMS = {
    "servers": 2,
    "max_num_seqs": 8,
    "prefill_ms_per_token": 0.5,
    "prefill_overhead_ms": 10,
    "decode_ms_per_token": 20,
    "decode_batch_growth": 0.0,
    "kv_blocks": 1000,
    "block_size": 16,
}
SCENARIO = {
    "name": "pd",
    "duration_s": 10,
    "pool": {**PARAMS, "roles": {"prefill": 1, "decode": 1}, "path_ms": 0},
    "kv_transfer": {"fixed_ms": 3, "bytes_per_token": 1_000_000, "gbytes_per_s": 1},
    "objectives": [{"name": "standard", "priority": 0, "slo_ttft_s": 1, "slo_tpot_s": 0.025}],
    "tenants": [
        {"name": "a", "objective": "standard", "rate_rps": 1, "prompt_tokens": 100,
         "output_tokens": 5}
    ],
    "baselines": [],
}  # fmt: skip
PREFILL, DECODE = 0, 1


class Recorder:
    def started(self, request, now):
        pass

    def first_token(self, request, now):
        pass

    def finished(self, request, now):
        pass


class Sidecar:
    """A policy that sends every request to DECODE by way of PREFILL."""

    def __init__(self, sim, prefill=PREFILL):
        self.sim = sim
        self.prefill = prefill
        self.finished_requests = []
        self.prefilled = []

    def arrive(self, request, now):
        self.sim.send(request, DECODE, now, self.prefill)

    def finished(self, request, now):
        self.finished_requests.append(request)

    def pool_changed(self, now):
        pass

    def prefill_done(self, request, now):
        self.prefilled.append((request.request_id, now))

    def first_token(self, request, now):
        pass

    def timer(self, now):
        pass

    def next_timer(self):
        return float("inf")

    def queued_by_priority(self):
        return {}

    def limits(self):
        return {}


def scenario(**changes):
    document = {**SCENARIO, **changes}
    return dataclasses.replace(parse_scenario(document), drain_s=10)


def run(arrivals, prefill=PREFILL, events=(), **changes):
    chosen = dataclasses.replace(scenario(**changes), events=tuple(events))
    sim = Simulation(chosen, [Arrived(t, 0, p, o) for t, p, o in arrivals], lambda _: (1.0, 2.0))
    policy = Sidecar(sim, prefill)
    sim.run(policy)
    return sim, policy


def test_a_request_with_remote_kv_computes_no_prefill_on_its_server():
    server = ModelServer(ServerParams(decode_ms_per_token=20.0), Recorder())
    request = ServerRequest(1, prompt_tokens=1000, output_tokens=3, remote_kv=True)
    server.admit(request, 0.0)
    while server.next_event_time() != float("inf"):
        server.advance(server.next_event_time())
    assert request.first_token_at == pytest.approx(0.020)
    assert request.finished_at == pytest.approx(0.060)


def test_kv_transfer_is_a_fixed_cost_plus_bytes_over_bandwidth():
    transfer = KvTransfer(fixed_ms=2.0, bytes_per_token=131072, gbytes_per_s=25.0)
    assert transfer.seconds(1000) == pytest.approx(0.002 + 1000 * 131072 / 25e9)


def test_remote_prefill_then_transfer_then_decode():
    sim, _ = run([(0.0, 100, 5)])
    request = sim.requests[0]
    prefill_s = (20 + 10 + 0.5 * 100) / 1000
    transfer_s = 0.003 + 100 * 1_000_000 / 1e9
    assert request.outcome == COMPLETED
    assert request.prefilled_at == pytest.approx(prefill_s)
    assert request.first_token_at == pytest.approx(prefill_s + transfer_s + 0.020)
    assert request.finished_at == pytest.approx(request.first_token_at + 4 * 0.020)
    assert (sim.servers[PREFILL].prompt_tokens, sim.servers[DECODE].prompt_tokens) == (100, 0)


def test_the_decode_server_prefills_locally_when_the_prefill_server_is_down():
    sim, _ = run([(1.0, 100, 5)], events=[ServerEvent(0.5, PREFILL, False)])
    request = sim.requests[0]
    assert request.fallback and request.prefilled_at is None
    assert request.first_token_at == pytest.approx(1.0 + (20 + 10 + 0.5 * 100) / 1000)
    assert request.outcome == COMPLETED


def test_a_prefill_lost_with_its_server_falls_back_to_a_local_prefill():
    sim, policy = run([(0.0, 1000, 5)], events=[ServerEvent(0.1, PREFILL, False)])
    request = sim.requests[0]
    assert request.fallback
    assert request.outcome == COMPLETED
    assert request.first_token_at == pytest.approx(0.1 + (20 + 10 + 0.5 * 1000) / 1000)
    assert policy.finished_requests == [request]


def test_a_request_whose_decode_server_fails_during_its_prefill_ends_once():
    sim, policy = run([(0.0, 1000, 5)], events=[ServerEvent(0.1, DECODE, False)])
    request = sim.requests[0]
    assert request.outcome == "server-failed"
    assert policy.finished_requests == [request]
    assert sim.waiting_by_tenant == [0]


def test_the_tenant_leaves_the_waiting_count_once_when_its_prefill_starts():
    sim, _ = run([(0.0, 100, 5), (0.0, 100, 5)])
    assert sim.waiting_by_tenant == [0]
    assert sim.service_by_tenant == [pytest.approx(2 * 100 + 2 * 2 * 5)]


def test_roles_label_the_servers_and_an_aggregated_run_labels_none():
    chosen = scenario()
    sim = Simulation(chosen, [], lambda _: (1.0, 2.0))
    roles = [e.labels.get(ROLE_LABEL) for e in sim.store.snapshot().endpoints]
    assert roles == ["prefill", "decode"]
    aggregated = Simulation(chosen, [], lambda _: (1.0, 2.0), aggregated=True)
    assert [dict(e.labels) for e in aggregated.store.snapshot().endpoints] == [{}, {}]


def test_servers_left_out_of_roles_have_no_role():
    chosen = scenario(pool={**PARAMS, "servers": 3, "roles": {"prefill": 1}})
    assert chosen.pool.roles == ("prefill", "", "")


@pytest.mark.parametrize(
    ("roles", "error"),
    [
        ({"prefill": 2, "decode": 1}, "pool.roles: gives 3 roles to 2 servers"),
        ({"cook": 1}, "pool.roles.cook: unknown field"),
        ({"decode": 0}, "pool.roles.decode: must be > 0, got 0"),
    ],
)
def test_bad_roles_are_errors_naming_their_path(roles, error):
    with pytest.raises(ScenarioError) as caught:
        scenario(pool={**PARAMS, "roles": roles})
    assert caught.value.errors == [error]


def finished(arrival, first_token_at, finished_at, output_tokens):
    request = SimRequest(0, 100, output_tokens, arrival=arrival)
    request.first_token_at, request.finished_at = first_token_at, finished_at
    request.outcome = COMPLETED
    return request


def test_goodput_counts_the_requests_that_meet_both_the_ttft_and_the_tpot_slo():
    requests = [
        finished(0.0, 0.5, 0.5 + 4 * 0.020, 5),  # meets both
        finished(0.0, 1.5, 1.5 + 4 * 0.020, 5),  # TTFT 1.5 s > 1 s
        finished(0.0, 0.5, 0.5 + 4 * 0.030, 5),  # TPOT 30 ms > 25 ms
        finished(0.0, 0.5, 0.5, 1),  # one token: no TPOT
    ]
    slos = tenant_slos(scenario())
    assert slos == [(1.0, 0.025)]
    stats = latency_stats(requests, slos)
    assert stats["goodput_rps"] == pytest.approx(2 / (1.5 + 4 * 0.020))
    assert latency_stats(requests, [(None, None)])["goodput_rps"] == stats["throughput_rps"]


def test_the_disaggregated_share_counts_requests_sent_by_way_of_a_prefill_server():
    sim, _ = run([(0.0, 100, 5), (0.5, 100, 5)])
    sim.requests[1].prefill_server = -1
    stats = disaggregation_stats(sim.requests, sim.scenario.kv_transfer)
    assert stats["disaggregated_share"] == 0.5
    assert stats["prefill_fallbacks"] == 0
    assert stats["kv_transfer_p50_s"] == pytest.approx(0.003 + 0.1)


def test_an_objective_takes_a_tpot_slo():
    document = yaml.safe_load(yaml.safe_dump(SCENARIO))
    document["objectives"][0]["slo_tpot_s"] = -1
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(document)
    assert caught.value.errors == ["objectives[0].slo_tpot_s: must be > 0, got -1"]
