"""Each engine end to end: simulated servers posing as vLLM, SGLang or trtllm-serve,
`epp serve` and a real Envoy. The EPP scrapes each engine at its own path and
names, sees the load, schedules on the servers, and reads the usage they report."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.engines import ENGINES
from epp.demo.stack import StackSettings, live_stack
from epp.sim.server_model import ServerParams

pytestmark = [pytest.mark.envoy]

SERVERS = 2
REQUESTS = 6
OUTPUT_TOKENS = 30
PARAMS = ServerParams(max_num_seqs=2, decode_ms_per_token=15.0, prefill_overhead_ms=2.0)


def values(text: str, name: str) -> dict[str, float]:
    """Samples of `name` by their model_server_endpoint label ('' when none)."""
    return {
        sample.labels.get("model_server_endpoint", ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def total(text: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def get(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200, url
        return await response.text()


async def chat_through_envoy(session: aiohttp.ClientSession, url: str, model: str) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "tell me a story " * 8}],
        "max_completion_tokens": OUTPUT_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


def engine_config(tmp_path, engine: str) -> str:
    """An EndpointPickerConfig naming `engine` as the default (file mode's way)."""
    path = tmp_path / "engine.yaml"
    path.write_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: metrics-data-source\n"
        "- type: core-metrics-extractor\n"
        f"  parameters: {{defaultEngine: {engine}}}\n"
        "dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n"
        "    extractors: [{pluginRef: core-metrics-extractor}]\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("engine", "named_by"),
    [("vllm", "label"), ("sglang", "label"), ("trtllm-serve", "label"), ("sglang", "config")],
)
async def test_the_epp_scrapes_schedules_on_and_reads_usage_from_each_engine(
    tmp_path, engine, named_by
):
    settings = StackSettings(
        servers=SERVERS,
        params=PARAMS,
        engine=engine,
        label_engine=named_by == "label",
        epp_config=engine_config(tmp_path, engine) if named_by == "config" else None,
    )
    async with live_stack(settings) as stack, aiohttp.ClientSession() as session:
        assert stack.envoy is not None
        epp = stack.epp_metrics_url

        async def ready_pods() -> float:
            return values(await get(session, epp), "llm_d_epp_ready_endpoints").get("", 0)

        for _ in range(200):
            if await ready_pods() == SERVERS:
                break
            await asyncio.sleep(0.05)
        assert await ready_pods() == SERVERS

        sending = [
            asyncio.create_task(chat_through_envoy(session, stack.envoy.url, settings.model))
            for _ in range(REQUESTS)
        ]
        seen_running = 0.0
        while not all(task.done() for task in sending):
            running = values(await get(session, epp), "epp_per_endpoint_running_requests")
            seen_running = max(seen_running, sum(running.values()))
            await asyncio.sleep(0.02)
        bodies = await asyncio.gather(*sending)

        served = []
        names = ENGINES[engine]
        for address in stack.endpoints:
            page = await get(session, f"http://{address}{names.metrics_path}")
            served.append(total(page, f"{names.prefix}e2e_request_latency_seconds_count"))

        async def output_tokens_read() -> bool:
            text = await get(session, epp)
            return total(text, "inference_objective_output_tokens_sum") == REQUESTS * OUTPUT_TOKENS

        for _ in range(100):
            if await output_tokens_read():
                break
            await asyncio.sleep(0.05)
        epp_page = await get(session, epp)

    assert seen_running >= 2, "the EPP never saw the servers' running requests"
    assert sum(served) == REQUESTS
    last_usage = json.loads(bodies[0].split(b"data: ")[-2])["usage"]
    assert last_usage["completion_tokens"] == OUTPUT_TOKENS
    assert total(epp_page, "inference_objective_output_tokens_sum") == REQUESTS * OUTPUT_TOKENS
    assert total(epp_page, "inference_objective_input_tokens_sum") == (
        REQUESTS * last_usage["prompt_tokens"]
    )
