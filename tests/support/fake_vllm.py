"""A stand-in model server on loopback: `/v1/completions`, a vLLM `/metrics`
page and `/v1/models` (the ids in `models`).

Each request is recorded with the `x-gateway-destination-endpoint` header it
came with and this server's own address, so a test can check that the
request reached the endpoint the EPP picked. A prompt starting with "hold"
waits until `release` is set; a body's `hold_s` holds the answer that long.
`peak` is the most requests it ran at once. Answers carry OpenAI usage (a
body's `usage`, else 3 prompt and 2 completion tokens), with `status`
(200 unless a test makes the server fail). Each record gets `ended` when
its answer is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

LOOPBACK = "127.0.0.1"

METRICS = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} 0.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} 0.1
"""


@dataclass(eq=False)
class FakeVllm:
    address: str = ""
    received: list[dict] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    running: int = 0
    peak: int = 0
    status: int = 200
    models: tuple[str, ...] = ("m",)

    async def completions(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        prompt = str(body.get("prompt", ""))
        record = {
            "prompt": prompt,
            "body": body,
            "destination": request.headers.get("x-gateway-destination-endpoint"),
            "headers": dict(request.headers),
            "at": time.monotonic(),
        }
        self.received.append(record)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            if prompt.startswith("hold"):
                await self.release.wait()
            if body.get("hold_s"):
                await asyncio.sleep(float(body["hold_s"]))
        finally:
            self.running -= 1
            record["ended"] = time.monotonic()
        return web.json_response(
            {
                "model": body.get("model"),
                "served_by": self.address,
                "choices": [{"text": "ok"}],
                "usage": body.get("usage") or {"prompt_tokens": 3, "completion_tokens": 2},
            },
            status=self.status,
        )

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=METRICS.format(running=self.running))

    async def list_models(self, _: web.Request) -> web.Response:
        data = [{"id": model, "object": "model", "owned_by": "vllm"} for model in self.models]
        return web.json_response({"object": "list", "data": data})


@contextlib.asynccontextmanager
async def running_fake_vllm() -> AsyncIterator[FakeVllm]:
    server = FakeVllm()
    app = web.Application()
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_get("/v1/models", server.list_models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, 0).start()
    server.address = f"{LOOPBACK}:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()
