"""A simulated vLLM server over HTTP, driven in real time by the simulator's model.

The OpenAI surface a gateway sees: `/v1/completions` and `/v1/chat/completions`
(JSON, or SSE when `stream` is true: one `data:` event per batch of tokens,
a usage event when `stream_options.include_usage`, then `data: [DONE]`),
`/v1/models`, `/health`, and `/metrics` with vLLM's series names. The
timing is `epp.sim.server_model.ModelServer`'s (continuous batching, KV
blocks, waiting queue), played on the event loop's clock: a timer fires
when the model's batch next changes and advances it to that time, which
resolves the requests whose first token or completion has come. A request
the model refuses (its waiting queue is full) gets 429, as vLLM does.

Prefill/decode disaggregation, as vLLM's NixlConnector protocol: a body
with `kv_transfer_params.do_remote_decode` is a remote prefill (counted in
`epp_sim_remote_prefills_total`; the answer carries the `kv_transfer_params`
a decode server pulls the KV with); a body with `do_remote_prefill` pulls
the prompt's KV (waiting `--kv-transfer`'s time for it) and decodes without
computing the prefill.

Prompt size is estimated at 4 characters a token; the output length is the
request's `max_tokens` (or `max_completion_tokens`), default 16.

    python -m epp.demo.model_server --count 4 --ready-file ports.json

runs `--count` servers on free loopback ports in one process and writes
`{"ports": [...], "pid": N}` once they listen; SIGTERM stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.sim.scenario import KvTransfer
from epp.sim.server_model import ModelServer, ServerParams, ServerRequest

CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 16
STREAM_BATCH_S = 0.05
"""How often a streaming response sends the tokens decoded since the last event."""
TOKEN_TEXT = " x"


@dataclass(slots=True, eq=False)
class _Pending:
    """What a handler waits on while the model works on its request."""

    first_token: asyncio.Future[float]
    finished: asyncio.Future[float]


class RealTimeModel:
    """A ModelServer on the event loop's clock (seconds since creation).

    One timer at a time, set for the model's next event; an admission may
    bring that event forward, so the timer is re-set after each call."""

    def __init__(self, params: ServerParams) -> None:
        self.model = ModelServer(params, self)
        self._loop = asyncio.get_running_loop()
        self._origin = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._sequence = 0
        self.finished_total = 0
        self.remote_prefills = 0

    def now(self) -> float:
        return self._loop.time() - self._origin

    def submit(
        self, prompt_tokens: int, output_tokens: int, remote_kv: bool = False
    ) -> _Pending | None:
        """The request's futures, or None when the waiting queue is full."""
        pending = _Pending(self._loop.create_future(), self._loop.create_future())
        self._sequence += 1
        request = ServerRequest(
            self._sequence, prompt_tokens, output_tokens, owner=pending, remote_kv=remote_kv
        )
        if not self.model.admit(request, self.now()):
            return None
        self._schedule()
        return pending

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        at = self.model.next_event_time()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at != math.inf:
            self._timer = self._loop.call_at(self._origin + at, self._fire, at)

    def _fire(self, at: float) -> None:
        self._timer = None
        self._timer_at = math.inf
        self.model.advance(max(at, self.now()))
        self._schedule()

    # ServerListener
    def started(self, request: ServerRequest, now: float) -> None:
        return None

    def first_token(self, request: ServerRequest, now: float) -> None:
        future = request.owner.first_token
        if not future.done():
            future.set_result(now)

    def finished(self, request: ServerRequest, now: float) -> None:
        self.finished_total += 1
        pending = request.owner
        if not pending.first_token.done():
            pending.first_token.set_result(now)
        if not pending.finished.done():
            pending.finished.set_result(now)


class _VllmCollector(Collector):
    """The model's state as vLLM names it, read at scrape time."""

    def __init__(self, model: RealTimeModel, model_name: str) -> None:
        self._model = model
        self._name = model_name

    def collect(self) -> Iterator[Metric]:
        state = self._model.model.metrics(self._model.now())
        params = self._model.model.params
        labels = ["model_name"]
        values = [self._name]
        for name, text, value in (
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", state.waiting),
            ("vllm:num_requests_running", "Requests in the running batch.", state.running),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", state.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, text, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Cache configuration.",
            labels=["block_size", "num_gpu_blocks"],
        )
        info.add_metric([str(params.block_size), str(params.kv_blocks)], 1.0)
        yield info
        success = CounterMetricFamily("vllm:request_success", "Finished requests.", labels=labels)
        success.add_metric(values, self._model.finished_total)
        yield success
        prefills = CounterMetricFamily(
            "epp_sim_remote_prefills", "Prefills run for a remote decode.", labels=labels
        )
        prefills.add_metric(values, self._model.remote_prefills)
        yield prefills


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int | None:
    """The estimated prompt size, or None when the prompt field is missing or mistyped."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        text = "".join(
            str(message.get("content", "")) for message in messages if isinstance(message, dict)
        )
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = "".join(map(str, prompt))
        if not isinstance(prompt, str):
            return None
        text = prompt
    return max(1, len(text) // CHARS_PER_TOKEN)


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


@dataclass(slots=True)
class _Reply:
    """Builds the OpenAI JSON of one response (or one stream event)."""

    chat: bool
    model: str
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def choice(self, tokens: int, finish: str | None) -> dict[str, Any]:
        text = TOKEN_TEXT * tokens
        if self.chat:
            return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def event(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    def whole(self, tokens: int, usage: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": TOKEN_TEXT * tokens},
                "finish_reason": "length",
            }
        else:
            choice = self.choice(tokens, "length")
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }


class SimulatedServer:
    """One simulated vLLM endpoint: `await start()`, then `await stop()`."""

    def __init__(
        self,
        params: ServerParams,
        model_name: str = "model",
        kv_transfer: KvTransfer | None = None,
    ) -> None:
        self.params = params
        self.model_name = model_name
        self.kv_transfer = kv_transfer or KvTransfer()
        self.model: RealTimeModel | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._counter = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.model = RealTimeModel(self.params)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_VllmCollector(self.model, self.model_name))
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.model is not None:
            self.model.close()

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "owned_by": "epp-sim"}],
            }
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self._registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        assert self.model is not None
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _error(400, "request body is not JSON", "BadRequestError")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, "`model` is required", "BadRequestError")
        prompt_tokens = _prompt_tokens(body, chat)
        if prompt_tokens is None:
            field_name = "messages" if chat else "prompt"
            return _error(400, f"`{field_name}` is required", "BadRequestError")
        output_tokens = _max_tokens(body)
        if output_tokens is None:
            return _error(400, "`max_tokens` must be a positive integer", "BadRequestError")
        params = self.model.model.params
        context = params.kv_blocks * params.block_size
        if prompt_tokens + output_tokens > context:
            return _error(
                400,
                f"This model's maximum context length is {context} tokens; the request "
                f"asks for {prompt_tokens + output_tokens}",
                "BadRequestError",
            )
        kv = body.get("kv_transfer_params")
        remote_prefill = isinstance(kv, dict) and kv.get("do_remote_prefill") is True
        if remote_prefill:
            await asyncio.sleep(self.kv_transfer.seconds(prompt_tokens))
        pending = self.model.submit(prompt_tokens, output_tokens, remote_prefill)
        if pending is None:
            return _error(429, "the waiting queue is full", "TooManyRequests")
        self._counter += 1
        reply = _Reply(chat, body["model"], f"cmpl-{self.port}-{self._counter}")
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": prompt_tokens + output_tokens,
        }
        if not body.get("stream"):
            await pending.finished
            whole = reply.whole(output_tokens, usage)
            if isinstance(kv, dict) and kv.get("do_remote_decode") is True:
                self.model.remote_prefills += 1
                whole["kv_transfer_params"] = self._kv_for_remote_decode(reply.request_id)
            return web.json_response(whole)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return await self._stream(request, reply, pending, output_tokens, usage, include_usage)

    def _kv_for_remote_decode(self, request_id: str) -> dict[str, Any]:
        """What vLLM's NixlConnector returns for a decode server to pull the KV."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"sim-{self.port}",
            "remote_block_ids": [],
            "remote_host": "127.0.0.1",
            "remote_port": self.port,
            "remote_request_id": request_id,
            "tp_size": 1,
        }

    async def _stream(
        self,
        request: web.Request,
        reply: _Reply,
        pending: _Pending,
        output_tokens: int,
        usage: dict[str, int],
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        first = await pending.first_token
        sent = 1
        await response.write(reply.event([reply.choice(1, None)]))
        step_s = self.params.decode_ms_per_token / 1000.0
        while not pending.finished.done():
            await asyncio.wait([pending.finished], timeout=STREAM_BATCH_S)
            if pending.finished.done():
                break
            decoded = min(output_tokens - 1, 1 + int((self.model.now() - first) / step_s))
            if decoded > sent:
                await response.write(reply.event([reply.choice(decoded - sent, None)]))
                sent = decoded
        rest = output_tokens - sent
        await response.write(reply.event([reply.choice(rest, "length")]))
        if include_usage:
            await response.write(reply.event([], usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _serve(
    count: int, params: ServerParams, model_name: str, ready_file: str, kv_transfer: KvTransfer
) -> None:
    servers = [SimulatedServer(params, model_name, kv_transfer) for _ in range(count)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        ports = [await server.start() for server in servers]
        path = Path(ready_file)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps({"ports": ports, "pid": os.getpid()}))
        temporary.replace(path)
        await stop.wait()
    finally:
        for server in servers:
            await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp.demo.model_server")
    parser.add_argument("--count", type=int, default=1, help="servers to run (default 1)")
    parser.add_argument(
        "--params",
        default="{}",
        help=f"JSON object of ServerParams fields; defaults: {json.dumps(asdict(ServerParams()))}",
    )
    parser.add_argument("--model", default="model", help="the model name /v1/models lists")
    parser.add_argument(
        "--kv-transfer",
        default="{}",
        help="JSON object of KvTransfer fields (a remote prefill's KV pull); "
        f"defaults: {json.dumps(asdict(KvTransfer()))}",
    )
    parser.add_argument("--ready-file", required=True, help="where to write the bound ports")
    args = parser.parse_args(argv)
    try:
        params = ServerParams(**json.loads(args.params))
    except (TypeError, ValueError) as error:
        parser.error(f"--params: {error}")
    try:
        kv_transfer = KvTransfer(**json.loads(args.kv_transfer))
    except (TypeError, ValueError) as error:
        parser.error(f"--kv-transfer: {error}")
    asyncio.run(_serve(args.count, params, args.model, args.ready_file, kv_transfer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
