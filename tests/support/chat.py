"""One chat request through a live stack's Envoy (tests that serve a configuration)."""

from __future__ import annotations

import aiohttp

from epp.demo.stack import StackSettings, live_stack


async def chat_through_envoy(settings: StackSettings) -> tuple[int, str, str | None]:
    """Status, body and dropped reason of one chat request through Envoy."""
    async with live_stack(settings) as stack, aiohttp.ClientSession() as session:
        assert stack.envoy is not None
        body = {
            "model": settings.model,
            "messages": [{"role": "user", "content": "hello " * 40}],
            "max_completion_tokens": 4,
        }
        async with session.post(f"{stack.envoy.url}/v1/chat/completions", json=body) as response:
            reason = response.headers.get("x-llm-d-request-dropped-reason")
            return response.status, await response.text(), reason
