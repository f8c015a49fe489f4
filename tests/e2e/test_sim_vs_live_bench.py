"""`bench.sim_vs_live`: the same scenario live and simulated, compared per objective.

The short run checks the shape and sanity of what the benchmark prints, not
its targets (a benchmark measures; the figures are in bench/README.md)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from bench.gateway_path import Envoyed, Served, path_of
from bench.sim_vs_live import (
    LiveRun,
    comparable,
    late_arrivals,
    live_parts,
    ratio,
    side_stats,
    sim_first_byte,
    sim_parts,
    with_live_path,
)
from epp.demo.loadgen import COMPLETED, LiveRequest
from epp.sim.requests import SimRequest
from epp.sim.scenario_file import ScenarioError, load_scenario
from epp.sim.workload import Arrived

SCENARIOS = Path(__file__).resolve().parents[2] / "config" / "scenarios"


@pytest.mark.envoy
async def test_short_run_prints_both_sides_of_every_objective_over_the_same_arrivals():
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.sim_vs_live",
        "--duration",
        "8",
        "--sim-runs",
        "2",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    objectives = result["objectives"]
    assert list(objectives) == ["premium", "standard", "batch"]
    for tier in objectives.values():
        assert tier["live"]["requests"] == tier["sim"]["requests"] > 0
        assert tier["live"]["completed"] + tier["live"]["rejected"] <= tier["live"]["requests"]
    for name in ("premium", "standard"):  # they fit in the pool, so both sides complete some
        for key in ("ttft_p50_ratio", "ttft_p90_ratio", "completed_ratio"):
            assert objectives[name][key] > 0
    premium = objectives["premium"]
    assert premium["live"]["ttft_p50_s"] > 0 and premium["sim"]["ttft_p50_s"] > 0
    low, high = premium["sim"]["ttft_p90_range_s"]
    assert low <= high
    assert result["live"]["errors"] == 0
    parts = premium["live"]["ttft_parts_ms"]
    assert all(0 <= low <= high for low, high in parts.values())
    assert parts["model"][0] <= parts["in_server"][0]
    simulated = premium["sim"]["ttft_parts_ms"]
    assert simulated["to_server"][0] > 0 and simulated["model"] == simulated["in_server"]
    late = result["live"]["loadgen_late_ms"]
    assert 0 <= late["p50"] <= late["p99"] <= late["max"]
    path = result["live"]["path_ms"]  # the completed requests seen by all three clocks
    done = sum(tier["live"]["completed"] for tier in objectives.values())
    assert 0 < path["end"]["n"] <= done
    assert 0 < path["response"]["p50"] <= path["response"]["p90"]
    assert path["request"] is None or 0 < path["request"]["p50"] <= path["request"]["p90"]


def test_the_path_is_split_into_straight_and_queued_requests_by_the_epps_answer():
    sent, arrived = 10.0, 10.001
    envoy = {
        "straight": Envoyed(arrived, arrived + 0.001, arrived + 0.004),
        "queued": Envoyed(arrived, arrived + 0.001, arrived + 0.5),
    }
    servers = {
        "straight": Served(arrived + 0.005, arrived + 0.1, arrived + 0.2),
        "queued": Served(arrived + 0.501, arrived + 0.6, arrived + 0.7),
    }
    requests = []
    for rid, served in servers.items():
        request = LiveRequest(0, 0.0, 10, 10, sent_at=0.0, outcome=COMPLETED, request_id=rid)
        request.first_token_at = served.first + 0.002 - sent
        request.finished_at = served.done + 0.003 - sent
        requests.append(request)
    path = path_of(requests, sent, envoy, servers, [True])
    assert path["request"]["n"] == 1 and path["queued_epp"]["n"] == 1
    assert path["request"]["p50"] == pytest.approx(6.0)
    assert path["epp"]["p50"] == pytest.approx(3.0)
    assert path["queued_epp"]["p50"] == pytest.approx(499.0)
    assert path["response"]["p50"] == pytest.approx(2.0)
    assert path["end"]["p50"] == pytest.approx(3.0)


def test_ratio_is_live_over_sim_and_one_when_both_sides_are_zero():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(0.0, 0.0) == 1.0
    assert ratio(1.0, 0.0) is None
    assert ratio(None, 1.0) is None


def test_late_arrivals_delay_each_arrival_by_one_measured_lateness_in_time_order():
    arrivals = [Arrived(0.1 * i, i % 2, 10, 10) for i in range(50)]
    late = late_arrivals(arrivals, [0.001, 0.004], seed=1)
    assert len(late) == len(arrivals)
    assert [a.time for a in late] == sorted(a.time for a in late)
    shifts = sorted(round(b.time - a.time, 6) for a, b in zip(arrivals, late, strict=True))
    assert set(shifts) <= {0.001, 0.004}
    assert late == late_arrivals(arrivals, [0.001, 0.004], seed=1)


def test_a_non_streaming_clients_first_byte_comes_with_the_whole_response():
    scenario = load_scenario(SCENARIOS / "demo-overload.yaml")
    streaming = next(i for i, t in enumerate(scenario.tenants) if t.stream)
    whole = next(i for i, t in enumerate(scenario.tenants) if not t.stream)
    first_byte = sim_first_byte(scenario)
    for tenant, expected in ((streaming, 1.5), (whole, 4.0)):
        request = SimRequest(1, 10, 10, tenant=tenant)
        request.first_token_at, request.finished_at = 1.5, 4.0
        assert first_byte(request) == expected


def test_server_events_are_left_out_of_both_sides_with_a_warning():
    scenario = load_scenario(SCENARIOS / "overload-three-tiers.yaml")
    played, warnings = comparable(scenario, 20.0)
    assert scenario.events and not played.events
    assert played.duration_s == 20.0
    assert any("server events" in warning for warning in warnings)


def test_a_pool_of_several_server_groups_is_refused_by_name():
    scenario = load_scenario(SCENARIOS / "adaptive-heterogeneous.yaml")
    with pytest.raises(ScenarioError, match=r"pool\.groups"):
        comparable(scenario, 20.0)


def test_a_live_ttft_starts_when_the_load_generator_sent_the_request():
    late = LiveRequest(0, 1.0, 10, 10, sent_at=1.02, outcome=COMPLETED, first_token_at=1.1)

    stats = side_stats([late], lambda r: r.first_token_at, lambda r: r.sent_at)

    assert stats["ttft_p50_s"] == pytest.approx(0.08)


def test_a_live_ttft_is_split_at_the_servers_receipt_and_first_write():
    request = LiveRequest(0, 0.0, 10, 10, sent_at=0.5, outcome=COMPLETED, request_id="a")
    request.first_token_at = 0.62
    served = {"a": Served(100.51, 100.6, 100.9, model_first=0.07, model_done=0.35)}
    run = LiveRun([request], 1.0, {}, served, origin=100.0)

    to_server, in_server, model, back = live_parts(run, [True])(request)

    assert (to_server, in_server, model, back) == pytest.approx((0.01, 0.09, 0.07, 0.02))


def test_a_simulated_ttft_is_split_at_its_delivery_and_its_response_delay():
    scenario = load_scenario(SCENARIOS / "demo-overload.yaml")
    streaming = next(i for i, t in enumerate(scenario.tenants) if t.stream)
    request = SimRequest(1, 10, 10, tenant=streaming, arrival=1.0)
    request.delivered_at, request.first_token_at, request.response_delay = 1.01, 1.1, 0.002

    to_server, in_server, model, back = sim_parts(scenario)(request)

    assert (to_server, in_server, model, back) == pytest.approx((0.01, 0.088, 0.088, 0.002))


def test_the_path_the_simulator_models_ends_where_the_server_model_begins():
    sent = 10.0
    envoy = {"a": Envoyed(sent + 0.001, sent + 0.002, sent + 0.004)}
    served = Served(sent + 0.005, sent + 0.1, sent + 0.2, 0.08, 0.18, entered=sent + 0.007)
    request = LiveRequest(0, 0.0, 10, 10, sent_at=0.0, outcome=COMPLETED, request_id="a")
    request.first_token_at, request.finished_at = 0.103, 0.203

    path = path_of([request], sent, envoy, {"a": served}, [True])

    assert path["request"]["p50"] == pytest.approx(5.0)
    assert path["to_model"]["p50"] == pytest.approx(7.0)
    assert path["from_model"]["p50"] == pytest.approx(16.0)  # the model's token at 10.087
    assert path["handler"]["p50"] == pytest.approx(15.0)  # 2 ms in, 13 ms out


def test_live_path_puts_the_measured_legs_in_the_simulated_pool_and_warns_of_a_missing_one():
    scenario = load_scenario(SCENARIOS / "demo.yaml")
    warnings: list[str] = []
    measured = {"to_model": {"p50": 9.0, "p90": 20.0}, "from_model": None}

    played = with_live_path(scenario, measured, warnings)

    assert (played.pool.request_path.median_ms, played.pool.request_path.p90_ms) == (9.0, 20.0)
    assert played.pool.response_path == scenario.pool.response_path
    assert warnings == ["--path live: the run measured no from_model; the scenario's stays"]
