"""The metrics measured on requests that went through a real Envoy to a
simulated vLLM: prompt tokens served from the server's prefix cache, the gaps
between streamed chunks, the EPP's time on each response, the scheduler's
plugin calls, and the data layer's poll errors and a stale endpoint for an
endpoint that does not answer. Asserted on the Prometheus text the EPP
serves."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from epp.demo.stack import StackSettings, live_stack
from epp.serve.metrics.catalogue import CATALOGUE
from epp.sim.server_model import ServerParams

pytestmark = [pytest.mark.envoy]

BLOCK = 16
PROMPT_TOKENS = 8 * BLOCK + 1
OUTPUT_TOKENS = 24
PARAMS = ServerParams(decode_ms_per_token=10.0, block_size=BLOCK)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def total(text: str, name: str, **labels: str) -> float:
    return sum(value for found, value in samples(text, name) if labels.items() <= found.items())


async def page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def stream_chat(session: aiohttp.ClientSession, url: str, model: str) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "c" * (4 * PROMPT_TOKENS)}],
        "max_completion_tokens": OUTPUT_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def until(check, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_the_reference_metrics_are_measured_on_requests_through_envoy():
    settings = StackSettings(servers=1, params=PARAMS)
    async with live_stack(settings) as stack, aiohttp.ClientSession() as session:
        assert stack.envoy is not None
        epp = stack.epp_metrics_url

        async def ready() -> bool:
            return total(await page(session, epp), "llm_d_epp_ready_endpoints") == 1

        await until(ready)
        for _ in range(2):  # the same prompt twice: the second reads its prefix from cache
            await stream_chat(session, stack.envoy.url, settings.model)

        async def both_released() -> bool:
            text = await page(session, epp)
            return total(text, "llm_d_epp_response_processing_duration_seconds_count") == 2

        await until(both_released)
        text = await page(session, epp)

        document = yaml.safe_load((stack.workdir / "endpoints.yaml").read_text())
        dead = closed_port()
        document["endpoints"].append(
            {"name": "dead", "address": "127.0.0.1", "port": str(dead), "labels": {}}
        )
        temporary = stack.workdir / "endpoints.tmp"
        temporary.write_text(yaml.safe_dump(document))
        temporary.replace(stack.workdir / "endpoints.yaml")

        async def polls_failed() -> bool:
            return total(await page(session, epp), "llm_d_epp_datalayer_poll_errors_total") > 0

        await until(polls_failed)
        errors_page = await page(session, epp)

    cached_blocks = (PROMPT_TOKENS - 1) // BLOCK
    assert total(text, "llm_d_epp_request_cached_tokens_count") == 2
    assert total(text, "llm_d_epp_request_cached_tokens_sum") == cached_blocks * BLOCK
    assert total(text, "inference_objective_prompt_cached_tokens_sum") == cached_blocks * BLOCK

    itl_count = total(text, "llm_d_epp_request_streaming_itl_seconds_count")
    itl_sum = total(text, "llm_d_epp_request_streaming_itl_seconds_sum")
    assert itl_count >= 4, "a streamed answer of 24 tokens at 10 ms comes in several chunks"
    assert 0.0 < itl_sum / itl_count < 1.0

    assert total(text, "llm_d_epp_response_processing_duration_seconds_count") == 2
    assert 0.0 < total(text, "llm_d_epp_response_processing_duration_seconds_sum") < 1.0

    for point, plugin in (
        ("Scorer", "queue-scorer"),
        ("Scorer", "kv-cache-utilization-scorer"),
        ("Scorer", "prefix-cache-scorer"),
        ("Picker", "max-score-picker"),
    ):
        labels = {"extension_point": point, "plugin_type": plugin, "plugin_name": plugin}
        assert total(text, "llm_d_epp_plugin_duration_seconds_count", **labels) >= 2, labels
        assert total(text, "inference_extension_plugin_duration_seconds_count", **labels) >= 2

    source = {"source_type": "metrics-data-source"}
    assert total(errors_page, "llm_d_inference_scheduler_datalayer_poll_errors_total", **source) > 0
    assert total(errors_page, "epp_model_server_scrape_failures_total", reason="connection") > 0
    assert total(errors_page, "llm_d_epp_flow_control_stale_endpoints") >= 1  # the dead one
    assert uncatalogued(text) == [] and uncatalogued(errors_page) == []


def uncatalogued(text: str) -> list[str]:
    """The page's series whose family or label names the catalogue does not give."""
    labels = {entry.name: set(entry.labels) for entry in CATALOGUE}
    labels.update({e.twin.name: set(e.twin_labels) for e in CATALOGUE if e.twin is not None})
    wrong = []
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        for sample in family.samples:
            if name not in labels or set(sample.labels) - {"le"} != labels[name]:
                wrong.append(f"{sample.name}{sorted(sample.labels)}")
    return wrong
