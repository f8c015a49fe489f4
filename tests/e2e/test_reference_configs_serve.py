"""The reference's sample configurations served for real: simulated model
servers, `epp serve --config-file <sample>` and Envoy on loopback. A few
representative samples (single profile with the decode filter, load-aware
scoring, P/D disaggregation, program-aware fairness, P/D gated by a
max-saturation-detector, the precise prefix cache without a tokenizer beside
the no-hit LRU scorer) answer a chat request through Envoy; the
OpenAI Python SDK lists models (a request without a body, which goes to a
random ready endpoint) and chats through the same Envoy."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from epp.demo.stack import StackSettings, live_stack
from tests.support.chat import chat_through_envoy

pytestmark = [pytest.mark.envoy]

SAMPLES = Path(__file__).parents[1] / "data" / "reference_configs"


@pytest.mark.parametrize(
    "sample",
    [
        "epp-config.yaml",
        "epp-estimate-prefix-cache-config.yaml",
        "pd-epp-config.yaml",
        "sim-program-aware-config.yaml",
        "sim-epp-no-hit-lru.yaml",
    ],
)
async def test_a_reference_sample_config_serves_a_chat_request(sample: str) -> None:
    status, text, _ = await chat_through_envoy(
        StackSettings(servers=2, epp_config=str(SAMPLES / sample))
    )
    assert status == 200, text
    assert '"choices"' in text


async def test_the_hybrid_saturation_sample_serves_through_a_prefill_and_a_decode_server() -> None:
    # The newer sample: a max-saturation-detector gates, its two children
    # filter both profiles, and every request is prefilled on the prefill pod.
    settings = StackSettings(
        servers=2,
        roles=("decode", "prefill"),
        epp_config=str(SAMPLES / "pd-hybrid-saturation-epp-config.yaml"),
    )
    status, text, _ = await chat_through_envoy(settings)
    assert status == 200, text
    assert '"choices"' in text


async def test_the_openai_sdk_lists_models_and_chats_through_envoy() -> None:
    settings = StackSettings(servers=2)
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        client = openai.AsyncOpenAI(base_url=f"{stack.envoy.url}/v1", api_key="unused")
        try:
            models = await client.models.list()
            assert [model.id for model in models.data] == [settings.model]
            reply = await client.chat.completions.create(
                model=settings.model,
                messages=[{"role": "user", "content": "hi"}],
                max_completion_tokens=3,
            )
            assert reply.choices and reply.usage is not None
        finally:
            await client.close()
