"""The simulated model server over HTTP, in process on a loopback port: vLLM's
formats, and its metrics pages as vLLM, SGLang and trtllm-serve write them."""

from __future__ import annotations

import asyncio
import json
from bisect import bisect_left
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
import pytest_asyncio

from epp.datalayer.engines import ENGINES
from epp.datalayer.reader import MetricsReader
from epp.demo.model_server import SimulatedServer
from epp.demo.server_formats import Api, RequestError, read_request, token_ids
from epp.demo.tokenizer_file import encoder, train
from epp.sim.server_model import ServerParams
from tests.support.metrics_page import MetricsPage
from tests.support.waiting import eventually

FAST = ServerParams(max_num_seqs=2, decode_ms_per_token=2.0, prefill_overhead_ms=1.0)
MODEL = "sim-model"


@asynccontextmanager
async def running(
    params: ServerParams = FAST, model: str = MODEL, **options
) -> AsyncIterator[tuple[SimulatedServer, str]]:
    server = SimulatedServer(params, model, **options)
    port = await server.start()
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await server.stop()


@pytest_asyncio.fixture
async def server_url():
    async with running() as (_, url):
        yield url


async def post(url: str, body: object) -> tuple[int, bytes, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=json.dumps(body).encode()) as response,
    ):
        return response.status, await response.read(), response.headers["Content-Type"]


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text(), response.headers["Content-Type"]


def sse_data(body: bytes) -> list[str]:
    return [
        line[6:] for event in body.decode().split("\n\n") for line in event.split("\n")
        if line.startswith("data: ")
    ]  # fmt: skip


async def cancelled(tasks: list[asyncio.Task]) -> None:
    """Cancel requests still running (their server aborts them)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], **fields}


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"{", "JSON decode error: "), (b"[1]", "the request body must be a JSON object")],
)
def test_a_body_that_is_not_a_json_object_is_refused_in_vllms_words(raw, message):
    with pytest.raises(RequestError) as refused:
        read_request(Api.COMPLETIONS, raw, ("m",))
    assert (refused.value.status, refused.value.kind) == (400, "BadRequestError")
    assert str(refused.value).startswith(message)


async def test_completion_reports_max_tokens_as_completion_usage(server_url):
    status, body, _ = await post(
        f"{server_url}/v1/completions", {"model": MODEL, "prompt": "x" * 40, "max_tokens": 7}
    )
    assert status == 200
    reply = json.loads(body)
    assert reply["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert reply["choices"][0]["text"].count("x") == 7
    assert reply["model"] == MODEL
    assert reply["id"].startswith("cmpl-")


async def test_a_repeated_prompt_reports_its_full_blocks_but_the_last_token_as_cached(server_url):
    prompt = {"model": MODEL, "prompt": "y" * (4 * 49), "max_tokens": 2}  # 49 tokens
    cached = []
    for _ in range(2):
        status, body, _ = await post(f"{server_url}/v1/completions", prompt)
        assert status == 200
        cached.append(json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 48]  # three blocks of 16; the 49th token is computed


async def test_with_a_tokenizer_json_the_prompt_counts_and_renders_in_its_tokens(tmp_path):
    text = "the quick brown fox jumps over the lazy dog " * 20
    encode = encoder(train(tmp_path, [text]))
    async with running(tokenizer=encode) as (_, url):
        body = {"model": MODEL, "prompt": text, "max_tokens": 2}
        status, reply, _ = await post(f"{url}/v1/completions", body)
        _, rendered, _ = await post(f"{url}/v1/completions/render", body)
    assert status == 200
    assert json.loads(reply)["usage"]["prompt_tokens"] == len(encode(text))
    assert json.loads(rendered)[0]["token_ids"] == encode(text) != token_ids(text)


async def test_streaming_chat_sends_a_role_chunk_then_every_token_then_usage_then_done(
    server_url,
):
    status, body, content_type = await post(
        f"{server_url}/v1/chat/completions",
        chat(max_tokens=40, stream=True, stream_options={"include_usage": True}),
    )
    assert status == 200
    assert content_type.startswith("text/event-stream")
    events = sse_data(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(chunk["id"].startswith("chatcmpl-") for chunk in chunks)
    assert all(chunk["choices"][0]["logprobs"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    text = "".join(chunk["choices"][0]["delta"]["content"] for chunk in chunks[:-1])
    assert text.count("x") == 40
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_continuous_usage_stats_put_cumulative_usage_on_every_chunk(server_url):
    options = {"include_usage": True, "continuous_usage_stats": True}
    request = chat(max_tokens=12, stream=True, stream_options=options)
    _, body, _ = await post(f"{server_url}/v1/chat/completions", request)
    chunks = [json.loads(event) for event in sse_data(body)[:-1]]
    completion = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert completion[0] == 0
    assert completion == sorted(completion)
    assert completion[-1] == 12


async def test_a_whole_chat_reply_has_vllms_fields(server_url):
    _, body, _ = await post(f"{server_url}/v1/chat/completions", chat(max_tokens=3))
    reply = json.loads(body)
    assert reply["id"].startswith("chatcmpl-")
    assert reply["object"] == "chat.completion"
    choice = reply["choices"][0]
    assert choice["logprobs"] is None
    assert choice["message"]["role"] == "assistant"


async def test_max_completion_tokens_wins_over_max_tokens(server_url):
    _, body, _ = await post(
        f"{server_url}/v1/chat/completions", chat(max_completion_tokens=3, max_tokens=9)
    )
    assert json.loads(body)["usage"]["completion_tokens"] == 3


async def test_null_max_tokens_is_the_default_length(server_url):
    status, body, _ = await post(f"{server_url}/v1/chat/completions", chat(max_tokens=None))
    assert status == 200
    assert json.loads(body)["usage"]["completion_tokens"] == 16


async def test_a_request_without_model_is_served_by_the_served_model(server_url):
    status, body, _ = await post(f"{server_url}/v1/completions", {"prompt": "hi", "max_tokens": 1})
    assert status == 200
    assert json.loads(body)["model"] == MODEL


async def test_an_unknown_model_answers_404(server_url):
    status, body, _ = await post(f"{server_url}/v1/completions", {"model": "other", "prompt": "p"})
    assert status == 404
    error = json.loads(body)["error"]
    assert error["type"] == "NotFoundError"
    assert "`other` does not exist" in error["message"]


async def test_the_served_model_names_are_configurable():
    async with running(served_model_names=("a", "b")) as (_, url):
        for name in ("a", "b"):
            status, _, _ = await post(f"{url}/v1/completions", {"model": name, "prompt": "p"})
            assert status == 200
        status, _, _ = await post(f"{url}/v1/completions", {"model": MODEL, "prompt": "p"})
        assert status == 404


async def test_a_request_takes_its_decode_steps(server_url):
    loop = asyncio.get_running_loop()
    started = loop.time()
    await post(f"{server_url}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 100})
    assert loop.time() - started >= 100 * FAST.decode_ms_per_token / 1000


async def test_full_waiting_queue_answers_503():
    params = ServerParams(max_num_seqs=1, max_waiting=1, decode_ms_per_token=5)
    async with running(params) as (_, url):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 50}
        replies = await asyncio.gather(*(post(f"{url}/v1/completions", body) for _ in range(4)))
    statuses = sorted(status for status, _, _ in replies)
    assert statuses[0] == 200
    assert statuses[-1] == 503


async def test_bad_json_and_missing_prompt_answer_400(server_url):
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server_url}/v1/completions", data=b"{not json") as response,
    ):
        assert response.status == 400
    status, _, _ = await post(f"{server_url}/v1/completions", {"model": MODEL})
    assert status == 400


async def test_responses_are_served_whole_and_continued(server_url):
    status, body, _ = await post(
        f"{server_url}/v1/responses", {"model": MODEL, "input": "x" * 40, "max_output_tokens": 5}
    )
    assert status == 200
    first = json.loads(body)
    assert first["id"].startswith("resp_")
    assert first["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "total_tokens": 15,
        "input_tokens_details": {"cached_tokens": 0},
    }
    status, body, _ = await post(
        f"{server_url}/v1/responses",
        {"model": MODEL, "previous_response_id": first["id"], "max_output_tokens": 2},
    )
    assert status == 200
    assert json.loads(body)["usage"]["input_tokens"] == 15


async def test_an_unknown_previous_response_answers_404(server_url):
    status, _, _ = await post(
        f"{server_url}/v1/responses", {"model": MODEL, "previous_response_id": "resp_nope"}
    )
    assert status == 404


async def test_streamed_responses_end_with_response_completed_and_its_usage(server_url):
    _, body, _ = await post(
        f"{server_url}/v1/responses",
        {"model": MODEL, "input": "hello", "max_output_tokens": 6, "stream": True},
    )
    events = [json.loads(data) for data in sse_data(body)]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["usage"]["output_tokens"] == 6
    deltas = "".join(event["delta"] for event in events if "delta" in event)
    assert deltas.count("x") == 6


@pytest.mark.parametrize("field", ["input", "messages"])
async def test_embeddings_are_served_for_input_and_messages(server_url, field):
    value = "x" * 20 if field == "input" else [{"role": "user", "content": "x" * 20}]
    status, body, _ = await post(f"{server_url}/v1/embeddings", {"model": MODEL, field: value})
    assert status == 200
    reply = json.loads(body)
    assert reply["data"][0]["object"] == "embedding"
    assert reply["usage"]["prompt_tokens"] == 5


async def test_models_list_vllms_fields_and_the_adapters():
    async with running(lora_adapters=("sql-lora",)) as (_, url):
        _, text, _ = await get(f"{url}/v1/models")
    cards = {card["id"]: card for card in json.loads(text)["data"]}
    assert set(cards) == {MODEL, "sql-lora"}
    assert cards[MODEL]["owned_by"] == "vllm"
    assert cards[MODEL]["max_model_len"] == FAST.kv_blocks * FAST.block_size
    assert cards["sql-lora"]["parent"] == MODEL
    assert {"created", "root", "permission"} <= set(cards[MODEL])


async def test_health(server_url):
    status, _, _ = await get(f"{server_url}/health")
    assert status == 200


async def test_a_request_longer_than_the_kv_cache_answers_400_at_once(server_url):
    context = FAST.kv_blocks * FAST.block_size
    status, body, _ = await post(
        f"{server_url}/v1/completions",
        {"model": MODEL, "prompt": "x" * 4 * context, "max_tokens": 1},
    )
    assert status == 400
    assert f"maximum context length is {context} tokens" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_whose_client_goes_away_is_aborted_not_finished(stream):
    async with running() as (server, url):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 5000, "stream": stream}
        async with aiohttp.ClientSession() as session:
            if stream:
                response = await session.post(f"{url}/v1/completions", json=body)
                await response.content.readline()
                await eventually(lambda: server.model.model.running == 1)
                response.close()
            else:
                task = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
                await eventually(lambda: server.model.model.running == 1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        await eventually(lambda: server.aborted_total == 1)
        assert server.model.model.running == 0
        assert server.model.finished_total == 0
        _, text, _ = await get(f"{url}/metrics")
    reasons = MetricsPage.parse(text).by_label("finished_reason", "vllm:request_success_total")
    assert reasons == {"abort": 1.0}


async def test_metrics_show_running_and_waiting_under_vllm_names_with_the_engine_label():
    async with running() as (server, url):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 5000}
        tasks = [asyncio.create_task(post(f"{url}/v1/completions", body)) for _ in range(3)]
        await eventually(lambda: len(server.model.model.waiting) == 1)
        _, text, _ = await get(f"{url}/metrics")
        await cancelled(tasks)
    found = {s.name: (s.labels, s.value) for s in MetricsPage.parse(text).samples}
    assert found["vllm:num_requests_running"] == ({"model_name": MODEL, "engine": "0"}, 2)
    assert found["vllm:num_requests_waiting"][1] == 1
    assert 0 < found["vllm:kv_cache_usage_perc"][1] < 1
    info = found["vllm:cache_config_info"][0]
    assert info["block_size"] == str(FAST.block_size)
    assert info["num_gpu_blocks"] == str(FAST.kv_blocks)
    assert {"engine", "cache_dtype", "gpu_memory_utilization", "enable_prefix_caching"} <= set(info)


async def test_metrics_have_ttft_and_e2e_histograms(server_url):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    for _ in range(2):
        await post(f"{server_url}/v1/completions", body)
    _, text, _ = await get(f"{server_url}/metrics")
    page = MetricsPage.parse(text)
    assert page.total("vllm:time_to_first_token_seconds_count") == 2
    assert page.total("vllm:e2e_request_latency_seconds_count") == 2
    assert page.total("vllm:e2e_request_latency_seconds_sum") >= page.total(
        "vllm:time_to_first_token_seconds_sum"
    )


async def test_adapters_show_in_lora_requests_info_and_the_reader_sees_them():
    params = ServerParams(max_num_seqs=2, decode_ms_per_token=5.0, max_loras=2)
    async with running(params, lora_adapters=("sql-lora",)) as (server, url):
        body = {"model": "sql-lora", "prompt": "hi", "max_tokens": 5000}
        task = asyncio.create_task(post(f"{url}/v1/completions", body))
        await eventually(lambda: server.model.model.running == 1)
        _, text, _ = await get(f"{url}/metrics")
        await cancelled([task])
    metrics = MetricsReader().read(text, ENGINES["vllm"], now=1.0)
    assert metrics.lora_running == {"sql-lora"}
    assert metrics.lora_max == 2


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm-serve"])
async def test_the_epps_reader_reads_each_pose_under_load(engine):
    async with running(engine=engine) as (server, url):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 5000}
        tasks = [asyncio.create_task(post(f"{url}/v1/completions", body)) for _ in range(3)]
        await eventually(lambda: len(server.model.model.waiting) == 1)
        _, text, _ = await get(f"{url}{ENGINES[engine].metrics_path}")
        await cancelled(tasks)
    metrics = MetricsReader().read(text, ENGINES[engine], now=1.0)
    assert (metrics.running, metrics.waiting) == (2, 1)
    assert 0 < metrics.kv_usage < 1
    assert (metrics.block_size, metrics.num_gpu_blocks) == (FAST.block_size, FAST.kv_blocks)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_the_inter_token_latency_histogram_holds_each_token_after_the_first(engine):
    async with running(engine=engine) as (_, url):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 6}
        await asyncio.gather(*(post(f"{url}/v1/completions", body) for _ in range(2)))
        _, text, _ = await get(f"{url}/metrics")
    metrics = MetricsReader().read(text, ENGINES[engine], now=1.0)
    assert metrics.itl_count == 2 * 5
    step = FAST.decode_ms_per_token * (1 + FAST.decode_batch_growth) / 1000  # a batch of two
    assert metrics.itl_sum >= metrics.itl_count * FAST.decode_ms_per_token / 1000
    assert metrics.itl_sum < metrics.itl_count * step + 0.1  # at most one prefill step more
    page = MetricsPage.parse(text)
    buckets = [s.value for s in page.series(f"{engine}:inter_token_latency_seconds_bucket")]
    assert buckets[-1] == metrics.itl_count  # the +Inf bucket holds every observation
    # The decode steps (at most one prefill step per request more) are in
    # the bucket of a step's length, as the reader gives them.
    index = bisect_left(metrics.itl_bounds, step)
    held = metrics.itl_buckets[index] - (metrics.itl_buckets[index - 1] if index else 0)
    assert held >= metrics.itl_count - 2


async def test_trtllm_serve_has_no_inter_token_latency_histogram():
    async with running(engine="trtllm-serve") as (_, url):
        await post(f"{url}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 6})
        _, text, _ = await get(f"{url}/prometheus/metrics")
    assert "inter_token_latency" not in text


@pytest.mark.parametrize("engine", ["sglang", "trtllm-serve"])
async def test_a_fresh_pose_has_no_load_samples_yet_and_reads_idle(engine):
    async with running(engine=engine) as (_, url):
        _, text, _ = await get(f"{url}{ENGINES[engine].metrics_path}")
    assert MetricsPage.parse(text).series(ENGINES[engine].running[0].name) == []
    metrics = MetricsReader().read(text, ENGINES[engine], now=1.0)
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (0, 0, 0)


async def test_trtllm_serves_json_iteration_stats_at_metrics():
    async with running(engine="trtllm-serve") as (_, url):
        await post(f"{url}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
        status, text, content_type = await get(f"{url}/metrics")
    assert status == 200
    assert content_type.startswith("application/json")
    stats = json.loads(text)
    assert stats[0]["kvCacheStats"]["maxNumBlocks"] == FAST.kv_blocks
    assert {"numActiveRequests", "numQueuedRequests"} <= set(stats[0])
