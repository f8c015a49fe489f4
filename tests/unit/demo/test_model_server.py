"""The simulated vLLM server over HTTP, in process on a loopback port."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from epp.demo.model_server import SimulatedServer
from epp.sim.server_model import ServerParams

FAST = ServerParams(max_num_seqs=2, decode_ms_per_token=2.0, prefill_overhead_ms=1.0)


@pytest_asyncio.fixture
async def server_url():
    server = SimulatedServer(FAST, "sim-model")
    port = await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()


async def post(url: str, body: object) -> tuple[int, bytes, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=json.dumps(body).encode()) as response,
    ):
        return response.status, await response.read(), response.headers["Content-Type"]


def metric_values(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_completion_reports_max_tokens_as_completion_usage(server_url):
    status, body, _ = await post(
        f"{server_url}/v1/completions", {"model": "m", "prompt": "x" * 40, "max_tokens": 7}
    )
    assert status == 200
    reply = json.loads(body)
    assert reply["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}
    assert reply["choices"][0]["text"].count("x") == 7
    assert reply["model"] == "m"


async def test_streaming_chat_sends_every_token_then_usage_then_done(server_url):
    status, body, content_type = await post(
        f"{server_url}/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200
    assert content_type.startswith("text/event-stream")
    events = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    text = "".join(chunk["choices"][0]["delta"]["content"] for chunk in chunks[:-1])
    assert text.count("x") == 40
    assert len(chunks) > 2


async def test_streaming_without_include_usage_sends_no_usage_event(server_url):
    _, body, _ = await post(
        f"{server_url}/v1/completions",
        {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True},
    )
    assert b'"usage"' not in body
    assert body.endswith(b"data: [DONE]\n\n")


async def test_a_request_takes_its_decode_steps(server_url):
    loop = asyncio.get_running_loop()
    started = loop.time()
    await post(f"{server_url}/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 100})
    assert loop.time() - started >= 100 * FAST.decode_ms_per_token / 1000


async def test_full_waiting_queue_answers_429():
    server = SimulatedServer(ServerParams(max_num_seqs=1, max_waiting=1, decode_ms_per_token=5))
    port = await server.start()
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": "m", "prompt": "hi", "max_tokens": 50}
        statuses = sorted(
            status for status, _, _ in await asyncio.gather(*(post(url, body) for _ in range(4)))
        )
    finally:
        await server.stop()
    assert statuses[-1] == 429
    assert statuses[0] == 200


async def test_bad_json_and_missing_prompt_answer_400(server_url):
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server_url}/v1/completions", data=b"{not json") as response,
    ):
        assert response.status == 400
    status, _, _ = await post(f"{server_url}/v1/completions", {"model": "m"})
    assert status == 400


async def test_metrics_show_running_and_waiting_under_vllm_names(server_url):
    body = {"model": "m", "prompt": "hi", "max_tokens": 200}
    tasks = [asyncio.create_task(post(f"{server_url}/v1/completions", body)) for _ in range(3)]
    await asyncio.sleep(0.1)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server_url}/metrics") as response,
    ):
        values = metric_values(await response.text())
    await asyncio.gather(*tasks)
    assert values["vllm:num_requests_running"] == 2
    assert values["vllm:num_requests_waiting"] == 1
    assert 0 < values["vllm:kv_cache_usage_perc"] < 1
    assert values["vllm:cache_config_info"] == 1


async def test_models_and_health(server_url):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server_url}/v1/models") as response:
            assert (await response.json())["data"][0]["id"] == "sim-model"
        async with session.get(f"{server_url}/health") as response:
            assert response.status == 200


async def test_a_request_longer_than_the_kv_cache_answers_400_at_once(server_url):
    context = FAST.kv_blocks * FAST.block_size
    status, body, _ = await post(
        f"{server_url}/v1/completions",
        {"model": "m", "prompt": "x" * 4 * context, "max_tokens": 1},
    )
    assert status == 400
    assert f"maximum context length is {context} tokens" in json.loads(body)["error"]["message"]
