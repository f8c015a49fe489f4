"""The load generator plays the simulator's workload against an HTTP server."""

from __future__ import annotations

import pytest_asyncio
from aiohttp import web

from epp.demo.loadgen import COMPLETED, LoadGenerator, outcome_of, prompt_text
from epp.demo.model_server import SimulatedServer
from epp.demo.report import live_report, render_live_text
from epp.sim.scenario_file import parse_scenario
from epp.sim.server_model import ServerParams
from epp.sim.workload import workload
from tests.support.upstream import http_upstream

SCENARIO = parse_scenario(
    {
        "name": "tiny",
        "seed": 3,
        "duration_s": 1.0,
        "pool": {"servers": 1, "decode_ms_per_token": 1},
        "objectives": [{"name": "gold", "priority": 5}, {"name": "bronze", "priority": -1}],
        "tenants": [
            {
                "name": "streamer",
                "objective": "gold",
                "rate_rps": 20,
                "prompt_tokens": 50,
                "output_tokens": 20,
            },
            {
                "name": "batcher",
                "objective": "bronze",
                "rate_rps": 10,
                "stream": False,
                "prompt_tokens": 50,
                "output_tokens": 20,
            },
        ],
        "baselines": [],
    }
)


@pytest_asyncio.fixture
async def server_url():
    server = SimulatedServer(ServerParams(decode_ms_per_token=1.0))
    port = await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()


async def test_plays_the_simulators_workload_and_completes_it(server_url):
    requests = await LoadGenerator(server_url, SCENARIO, timeout=10).run()
    expected = workload(SCENARIO)
    assert [(r.arrival, r.tenant) for r in requests] == [(a.time, a.tenant) for a in expected]
    assert {r.outcome for r in requests} == {COMPLETED}
    assert all(r.arrival <= r.first_token_at <= r.finished_at for r in requests)


async def test_streamed_requests_see_the_first_token_before_the_end(server_url):
    requests = await LoadGenerator(server_url, SCENARIO, timeout=10).run()
    streamed = [r for r in requests if r.tenant == 0]
    assert all(r.first_token_at < r.finished_at for r in streamed)


async def test_max_requests_bounds_the_run(server_url):
    requests = await LoadGenerator(server_url, SCENARIO, max_requests=3, timeout=10).run()
    assert len(requests) == 3


async def test_several_urls_take_the_requests_in_turn():
    servers = [SimulatedServer(ServerParams(decode_ms_per_token=1.0)) for _ in range(2)]
    urls = [f"http://127.0.0.1:{await server.start()}" for server in servers]
    try:
        requests = await LoadGenerator(urls, SCENARIO, max_requests=6, timeout=10).run()
    finally:
        for server in servers:
            await server.stop()
    assert {r.outcome for r in requests} == {COMPLETED}
    assert [server.model.admitted_total for server in servers] == [3, 3]


async def test_no_response_is_an_error_outcome_not_a_status():
    async def hang_up(request: web.Request) -> web.Response:
        request.transport.close()
        return web.Response()

    async with http_upstream(hang_up, "/v1/completions") as port:
        url = f"http://127.0.0.1:{port}"
        requests = await LoadGenerator(url, SCENARIO, max_requests=2, timeout=5).run()
    assert all(r.outcome.startswith("error: ") and not r.answered for r in requests)


def test_outcome_is_the_drop_reason_else_the_status():
    assert outcome_of(200, None) == COMPLETED
    assert outcome_of(429, "rejected-saturated") == "rejected-saturated"
    assert outcome_of(502, None) == "http-502"


async def test_report_has_one_entry_per_tier_under_policy_epp(server_url):
    requests = await LoadGenerator(server_url, SCENARIO, timeout=10).run()
    report = live_report(SCENARIO, requests, 1.5, None)
    tiers = report["policies"]["epp"]["objectives"]
    assert set(tiers) == {"gold", "bronze"}
    assert tiers["gold"]["priority"] == 5
    assert tiers["gold"]["requests"] + tiers["bronze"]["requests"] == len(requests)
    assert "gold (priority 5)" in render_live_text(report)


async def test_records_when_each_request_left_no_earlier_than_its_arrival(server_url):
    requests = await LoadGenerator(server_url, SCENARIO, timeout=10).run()
    assert all(r.arrival <= r.sent_at <= r.first_token_at for r in requests)


def test_prompts_share_only_their_tenants_prefix_at_four_characters_a_token():
    plain = parse_scenario(
        {
            "name": "prompts",
            "duration_s": 1.0,
            "pool": {"servers": 1},
            "objectives": [{"name": "gold", "priority": 0}],
            "tenants": [
                {
                    "name": "own",
                    "objective": "gold",
                    "rate_rps": 1,
                    "prompt_tokens": 100,
                    "output_tokens": 1,
                },
                {
                    "name": "shared",
                    "objective": "gold",
                    "rate_rps": 1,
                    "prompt_tokens": 100,
                    "output_tokens": 1,
                    "prefix": {"group": "system", "tokens": 64},
                },
            ],
        }
    )
    own, shared = plain.tenants
    first, second = prompt_text(own, 1, 100), prompt_text(own, 11, 100)
    assert len(first) == len(second) == 400
    assert first[:16] != second[:16]
    a, b = prompt_text(shared, 2, 164), prompt_text(shared, 3, 164)
    assert a[:256] == b[:256] and a[256:272] != b[256:272]
