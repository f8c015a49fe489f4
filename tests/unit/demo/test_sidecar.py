"""The routing sidecar: with `x-prefiller-host-port` it prefills on the named
server and decodes on its own; without it, or when the prefill fails, the
decode server does both. Real simulated servers on loopback."""

from __future__ import annotations

import json

import aiohttp
import pytest
import pytest_asyncio

from epp.cli import main
from epp.demo.model_server import SimulatedServer
from epp.demo.processes import start_child
from epp.demo.sidecar import PREFILLER_HEADER, Sidecar, prefill_body
from epp.sim.scenario import KvTransfer
from epp.sim.server_model import ServerParams
from tests.support.metrics_page import fetch_page

PARAMS = ServerParams(decode_ms_per_token=1.0, prefill_ms_per_token=0.01, prefill_overhead_ms=1)
BODY = {"model": "model", "prompt": "x" * 400, "max_tokens": 5}


@pytest_asyncio.fixture
async def pd():
    prefill = SimulatedServer(PARAMS)
    decode = SimulatedServer(PARAMS, kv_transfer=KvTransfer(fixed_ms=1.0))
    await prefill.start()
    await decode.start()
    sidecar = Sidecar(f"127.0.0.1:{decode.port}")
    await sidecar.start()
    async with aiohttp.ClientSession() as session:
        try:
            yield prefill, decode, sidecar, session
        finally:
            await sidecar.stop()
            await decode.stop()
            await prefill.stop()


async def remote_prefills(session, server):
    page = await fetch_page(session, f"http://127.0.0.1:{server.port}/metrics")
    assert page.series("epp_sim_remote_prefills_total"), "no epp_sim_remote_prefills series"
    return page.total("epp_sim_remote_prefills_total")


async def post(session, sidecar, body, headers=None):
    url = f"http://127.0.0.1:{sidecar.port}/v1/completions"
    async with session.post(url, json=body, headers=headers or {}) as response:
        return response.status, await response.read()


def test_the_prefill_leg_asks_for_one_token_unstreamed_and_a_remote_decode():
    leg = prefill_body({**BODY, "stream": True, "stream_options": {"include_usage": True}})
    assert (leg["max_tokens"], leg["stream"], "stream_options" in leg) == (1, False, False)
    assert leg["kv_transfer_params"]["do_remote_decode"] is True
    assert leg["prompt"] == BODY["prompt"]


async def test_with_the_header_the_prefill_runs_on_the_named_server(pd):
    prefill, decode, sidecar, session = pd
    status, answer = await post(
        session, sidecar, BODY, {PREFILLER_HEADER: f"127.0.0.1:{prefill.port}"}
    )
    assert status == 200
    assert json.loads(answer)["usage"]["completion_tokens"] == 5
    assert await remote_prefills(session, prefill) == 1
    assert (prefill.model.finished_total, decode.model.finished_total) == (1, 1)
    assert decode.model.model.prompt_tokens == 0  # it computed no prefill
    assert sidecar.stats.remote_prefills == 1


async def test_a_streamed_answer_comes_through_the_sidecar(pd):
    prefill, _, sidecar, session = pd
    status, answer = await post(
        session,
        sidecar,
        {**BODY, "stream": True},
        {PREFILLER_HEADER: f"127.0.0.1:{prefill.port}"},
    )
    assert status == 200
    assert answer.rstrip().endswith(b"data: [DONE]")


async def test_without_the_header_the_decode_server_does_both_stages(pd):
    prefill, decode, sidecar, session = pd
    status, _ = await post(session, sidecar, BODY)
    assert status == 200
    assert (prefill.model.finished_total, decode.model.finished_total) == (0, 1)
    assert decode.model.model.prompt_tokens == 100
    assert sidecar.stats.local == 1


async def test_an_unreachable_prefill_server_falls_back_to_a_local_prefill(pd):
    _, decode, sidecar, session = pd
    status, _ = await post(session, sidecar, BODY, {PREFILLER_HEADER: "127.0.0.1:1"})
    assert status == 200
    assert decode.model.model.prompt_tokens == 100
    assert (sidecar.stats.fallbacks, sidecar.stats.remote_prefills) == (1, 0)


@pytest.mark.parametrize("path", ["/metrics", "/health", "/v1/models"])
async def test_other_paths_reach_the_decode_server(pd, path):
    _, _, sidecar, session = pd
    async with session.get(f"http://127.0.0.1:{sidecar.port}{path}") as response:
        assert response.status == 200


async def test_epp_sidecar_on_a_free_port_in_front_of_a_model_server_routes_a_prefill(tmp_path):
    prefill = SimulatedServer(PARAMS)
    decode = SimulatedServer(PARAMS, kv_transfer=KvTransfer(fixed_ms=1.0))
    await prefill.start()
    await decode.start()
    child = await start_child(
        "epp sidecar",
        ["-m", "epp", "sidecar", "--port", "0", "--model-server-port", str(decode.port),
         "--bind-address", "127.0.0.1", "--prefill-timeout", "5s"],
        tmp_path,
    )  # fmt: skip
    try:
        (port,) = child.ready["ports"]
        url = f"http://127.0.0.1:{port}/v1/completions"
        headers = {PREFILLER_HEADER: f"127.0.0.1:{prefill.port}"}
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=BODY, headers=headers) as response:
                assert response.status == 200
                assert (await response.json())["usage"]["completion_tokens"] == 5
            assert await remote_prefills(session, prefill) == 1
        assert decode.model.finished_total == 1
    finally:
        await child.stop()
        await decode.stop()
        await prefill.stop()


@pytest.mark.parametrize(
    ("arguments", "fault"),
    [
        (["--prefill-timeout", "0s"], "--prefill-timeout"),
        (["--prefill-timeout", "1.5"], "--prefill-timeout"),
        (["--decoders", "127.0.0.1:1", "--model-server-port", "2"], "--decoders"),
    ],
)
def test_epp_sidecar_refuses_unusable_flags_naming_them(arguments, fault, capsys):
    assert main(["sidecar", *arguments]) == 2
    assert capsys.readouterr().err.startswith(f"epp sidecar: {fault}")
