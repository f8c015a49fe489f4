"""The live server tells the adaptive gate what responses say: a streamed
response's first bytes take its request off its endpoint's pending budget,
and its time per output token is its endpoint's latency when its server
reports none; a server that does is read at each scrape."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.engines import ENGINE_LABEL
from epp.datalayer.scraper import MetricsScraper
from epp.datalayer.store import EndpointStore
from epp.demo.model_server import SimulatedServer
from epp.extproc.events import FirstToken, Release
from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.serve.server import EppServer
from epp.sim.server_model import ServerParams
from tests.support.http_server import http_server
from tests.support.serving import loopback_options
from tests.support.waiting import eventually

ENDPOINT = "127.0.0.1:1"


def sent(live: EppServer) -> FlowRequest:
    """A request the core dispatched to ENDPOINT (pending there)."""
    request = FlowRequest("r", "f", 0, live.service.clock())
    assert live.admission.offer(request) is Outcome.DISPATCHED
    assert request.endpoint == ENDPOINT
    return request


async def test_the_first_bytes_of_a_streamed_response_take_its_request_off_the_budget():
    live = EppServer(loopback_options(endpoints=ENDPOINT))
    assert isinstance(live.core.credits, AdaptiveGate)  # the default configuration's gate
    request = sent(live)
    assert live.core.credits._estimators[ENDPOINT].pending == 1
    live.service.settle(FirstToken(request))
    assert request.running and live.core.credits._estimators[ENDPOINT].pending == 0


async def test_a_streamed_response_tells_its_endpoint_latency():
    live = EppServer(loopback_options(endpoints=ENDPOINT))
    request = sent(live)
    first = live.service.clock() - 0.4
    live.service.settle(Release(request, Usage(10, 5), 100, first_byte_at=first, streaming=True))
    assert request.state is State.COMPLETED
    assert live.core.credits._estimators[ENDPOINT].latency.itl == pytest.approx(0.1, rel=0.05)


def test_a_whole_response_tells_no_latency():
    release = Release(FlowRequest("r", "f", 0, 0.0), Usage(10, 5), 100, first_byte_at=1.0)
    assert release.time_per_output_token(2.0) is None


async def test_the_gate_reads_a_live_servers_inter_token_latency_from_its_scrapes():
    # A model server posing as vLLM, scraped over HTTP as `epp serve` does:
    # the gate learns the server's decode step from its histogram, before
    # any response has ended.
    params = ServerParams(max_num_seqs=4, decode_ms_per_token=10.0, decode_batch_growth=0.0)
    server = SimulatedServer(params, "model")
    port = await server.start()
    address = f"127.0.0.1:{port}"
    store = EndpointStore([EndpointSpec(address, address, {ENGINE_LABEL: "vllm"})])
    gate = AdaptiveGate(store.snapshot, time.monotonic)
    body = {"model": "model", "prompt": "hi", "max_tokens": 100_000}
    try:
        async with MetricsScraper(store, interval=0.02, timeout=0.5), aiohttp.ClientSession() as s:
            tasks = [asyncio.create_task(s.post(f"http://{address}/v1/completions", json=body))]
            await eventually(
                lambda: gate.has_room(address) and gate._estimators[address].latency.itl > 0
            )
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await server.stop()
    estimator = gate._estimators[address]
    assert estimator.latency.server_itl
    assert estimator.latency.mean_itl == pytest.approx(0.010)  # one request decoding: the bare step
    # Its median, from the buckets: within the step's bucket (vLLM's first, up to 10 ms).
    assert 0.0 < estimator.latency.itl <= 0.010


IDLE_VLLM_PAGE = (
    'vllm:num_requests_waiting{model_name="m"} 0.0\n'
    'vllm:num_requests_running{model_name="m"} 0.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.0\n'
)


async def idle_page(_: web.Request) -> web.Response:
    return web.Response(text=IDLE_VLLM_PAGE)


async def test_a_request_held_for_the_pending_budget_goes_at_the_next_read_though_it_is_the_same():
    # A server fast enough to read idle at every scrape (bench.extproc_e2e's
    # stand-in): what the gate holds back behind the pending budget waits
    # for the next read, which must poke the core although it reads the same.
    async with http_server({"/metrics": idle_page}) as server:
        address = f"127.0.0.1:{server.port}"
        live = EppServer(loopback_options(endpoints=address))
        store = live.store

        def read_at() -> float | None:
            return store.get(address).metrics.updated_at

        async with MetricsScraper(store, live.admission.poke, interval=0.1, timeout=1.0):
            await eventually(lambda: read_at() is not None)
            first = read_at()
            offered = [FlowRequest(f"r{i}", "f", 0, live.service.clock()) for i in range(2)]
            # One not yet seen running is the endpoint's whole budget: the second waits.
            assert [live.admission.offer(request) for request in offered] == [
                Outcome.DISPATCHED,
                None,
            ]
            await eventually(lambda: read_at() > first)  # idle, as the read before
            await eventually(lambda: offered[1].state is State.DISPATCHED, timeout=0.5)
