"""A simulated model server over HTTP (vLLM by default, or posing as SGLang or
trtllm-serve), driven in real time by the simulator's model.

The OpenAI surface a gateway sees, in vLLM's formats (`server_formats`):
`/v1/completions`, `/v1/chat/completions`, `/v1/responses`,
`/v1/embeddings` (JSON, or SSE when `stream` is true), `/v1/models` with
vLLM's fields, `/health`, the engine's metrics pages (`server_metrics`),
and vLLM's tokenizer endpoints (`/v1/completions/render`,
`/v1/chat/completions/render`, `/tokenize`) over its own tokenizer
(`server_formats.token_ids`, or a real `tokenizer.json` given as
`tokenizer`, the one an EPP's local token producer loads). With `kv_events` it publishes its prefix
cache's stores and evictions as vLLM does (`kv_publisher`).
A request for a model the server does not serve gets 404 (the served names
are configurable; LoRA adapters count, and a request for one runs it); a
request the model refuses (its waiting queue is full) gets 503, as vLLM's
queue cap answers; a request whose client goes away is aborted in the model
and counted as aborted, not finished.

The timing is `epp.sim.server_model.ModelServer`'s (continuous batching, KV
blocks, waiting queue), played on the event loop's clock
(`epp.demo.realtime_model`). Its prefix cache is keyed by the prompt text's
chained block hashes, so a prompt that repeats a cached prefix computes
only the rest, and the usage reports the cached tokens (`prompt_tokens_details.cached_tokens`).

Prefill/decode disaggregation, as vLLM's NixlConnector protocol: a body
with `kv_transfer_params.do_remote_decode` is a remote prefill (counted in
`epp_sim_remote_prefills_total`; the answer carries the `kv_transfer_params`
a decode server pulls the KV with); a body with `do_remote_prefill` pulls
the prompt's KV (waiting `--kv-transfer`'s time for it) and decodes without
computing the prefill.

    python -m epp.demo.model_server --count 4 --ready-file ports.json [--engine sglang]

runs `--count` servers on free loopback ports in one process and writes
`{"ports": [...], "pid": N}` once they listen; SIGTERM stops them (the
command line and `serving_on` are `epp.demo.model_servers`). With
`--timing-log FILE` (`timing`) every answered request appends
`{"id": x-request-id, "received", "entered", "first", "done", "model_first",
"model_done"}`: when its handler began, when the request entered the model,
when its first token was written (streamed; else when its answer was), and
when its answer ended, in `time.monotonic()` seconds, the clock every process
on the machine shares (`bench.gateway_path` matches them to the client's
and Envoy's times); and the model's own first token and end, in seconds of
the model's clock after the request entered it (the simulator's server
model, without the handler's and the event loop's time around it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TextIO

import orjson
from aiohttp import web

from epp.demo.kv_publisher import (
    KVEventPublisher,
    KVEventsPublishing,
    cleared,
    removed,
    stored,
)
from epp.demo.realtime_model import Pending, RealTimeModel
from epp.demo.server_formats import (
    CHARS_PER_TOKEN,
    Api,
    Reply,
    RequestError,
    bad_request,
    json_object,
    prompt_of,
    read_request,
    token_ids,
)
from epp.demo.server_metrics import CONTENT_TYPE, ENGINES, MetricsPages
from epp.extproc.headers import REQUEST_ID
from epp.scheduling.kvblocks import BlockHasher, BlockRemoved, BlockStored, KVEvent
from epp.scheduling.prefix import block_hashes
from epp.sim.scenario import KvTransfer
from epp.sim.server_model import (
    ServerParams,
)

STREAM_BATCH_S = 0.05
"""How often a streaming response sends the tokens decoded since the last event."""
STORED_RESPONSES = 1000
"""Responses kept for `previous_response_id` (the oldest is forgotten first)."""


class SimulatedServer:
    """One simulated endpoint: `await start()`, then `await stop()`.

    `served_model_names` are the names it answers to (default: `model_name`);
    `lora_adapters` are served too, each running as that adapter;
    `engine` is the pose of its metrics pages (vllm, sglang, trtllm-serve);
    `kv_transfer` the time a remote prefill's KV takes to pull;
    `kv_events`, when given, makes it publish its prefix cache's changes as
    vLLM's KV events over ZMQ, keyed by vLLM's block keys of its tokens.
    It tokenizes as vLLM's `/v1/completions/render`,
    `/v1/chat/completions/render` (unless `render_endpoints` is off, as on
    a server without them) and `/tokenize` answer, each `tokenize_delay_s`
    late."""

    def __init__(
        self,
        params: ServerParams,
        model_name: str = "model",
        kv_transfer: KvTransfer | None = None,
        *,
        engine: str = "vllm",
        served_model_names: tuple[str, ...] = (),
        lora_adapters: tuple[str, ...] = (),
        kv_events: KVEventsPublishing | None = None,
        tokenize_delay_s: float = 0.0,
        render_endpoints: bool = True,
        timing: TextIO | None = None,
        tokenizer: Callable[[str], list[int]] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.params = params
        self.model_name = model_name
        self.engine = engine
        self.served = served_model_names or (model_name,)
        self.lora_adapters = lora_adapters
        self.kv_transfer = kv_transfer or KvTransfer()
        self.model: RealTimeModel | None = None
        self.pages: MetricsPages | None = None
        self.port = 0
        self.aborted_total = 0
        self._runner: web.AppRunner | None = None
        self._created = int(time.time())
        self._responses: OrderedDict[str, int] = OrderedDict()
        self.kv_events = kv_events
        self.tokenize_delay_s = tokenize_delay_s
        self.render_endpoints = render_endpoints
        self.tokenizer = tokenizer
        self.host = host
        """Where `start()` listens unless told."""
        """A real tokenizer of prompt text (`epp.demo.tokenizer_file`); None:
        the simulated one (`server_formats.token_ids`)."""
        self.timing = timing
        """Where each answered request's times go, one JSON line (module docstring)."""
        self.publisher: KVEventPublisher | None = None
        self._kv_queue: asyncio.Queue[list[KVEvent] | None] = asyncio.Queue()
        self._kv_task: asyncio.Task[None] | None = None
        self._hasher = (
            BlockHasher(params.block_size, kv_events.hash_seed, kv_events.algorithm)
            if kv_events is not None
            else None
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._handler(Api.COMPLETIONS))
        app.router.add_post("/v1/chat/completions", self._handler(Api.CHAT))
        app.router.add_post("/v1/responses", self._handler(Api.RESPONSES))
        app.router.add_post("/v1/embeddings", self._handler(Api.EMBEDDINGS))
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        if self.render_endpoints:
            app.router.add_post("/v1/completions/render", self._render(Api.COMPLETIONS))
            app.router.add_post("/v1/chat/completions/render", self._render(Api.CHAT))
        app.router.add_post("/tokenize", self._tokenize)
        if self.engine == "trtllm-serve":
            app.router.add_get("/metrics", self._iteration_stats)
            app.router.add_get("/prometheus/metrics", self._metrics)
        else:
            app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, host: str = "", port: int = 0) -> int:
        host = host or self.host
        publishing = self.kv_events
        self.model = model = RealTimeModel(
            self.params, self._kv_queue.put_nowait if publishing is not None else None
        )
        self.pages = MetricsPages(
            self.engine,
            self.served[0],
            self.params,
            lambda: model.model.metrics(model.now()),
            lambda: model.admitted_total > 0,
        )
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if publishing is not None:
            self.publisher = KVEventPublisher(
                publishing.host or host,
                publishing.port,
                f"kv@{publishing.host or host}@{self.served[0]}",
                None if publishing.connect else publishing.replay_port,
                connect=publishing.connect,
            )
            try:
                await self.publisher.__aenter__()
            except BaseException:  # a port taken: free the HTTP port and what was bound
                await self.stop()
                raise
            self._kv_task = asyncio.create_task(self._publish(self.publisher))
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.model is not None:
            self.model.close()
        if self._kv_task is not None:
            self._kv_queue.put_nowait(None)
            await self._kv_task
            self._kv_task = None
        if self.publisher is not None:
            await self.publisher.__aexit__(None, None, None)
            self.publisher = None

    def restart(self) -> None:
        """The model process restarts in place: every request it holds is
        lost and its KV cache with it (published as AllBlocksCleared)."""
        if self.model is not None:
            self.model.fail()

    async def _publish(self, publisher: KVEventPublisher) -> None:
        """Publish the model's cache changes, a batch per drained log, in order."""
        size = self.params.block_size
        while (entries := await self._kv_queue.get()) is not None:
            events: list[object] = []
            for entry in entries:
                if isinstance(entry, BlockStored):
                    events.append(
                        stored(entry.block_hashes, entry.parent_block_hash, entry.token_ids, size)
                    )
                elif isinstance(entry, BlockRemoved):
                    events.append(removed(entry.block_hashes))
                else:
                    events.append(cleared())
            await publisher.publish(events)

    def _render(self, api: Api):
        async def handle(request: web.Request) -> web.Response:
            try:
                tokens = await self._tokens_of(api, await request.read())
            except RequestError as error:
                return web.json_response(error.body(), status=error.status)
            if api is Api.CHAT:
                return web.json_response({"token_ids": tokens})
            return web.json_response([{"token_ids": tokens}])

        return handle

    async def _tokenize(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
            api = Api.CHAT if isinstance(body, dict) and "messages" in body else Api.COMPLETIONS
            tokens = await self._tokens_of(api, raw)
        except (orjson.JSONDecodeError, RequestError):
            return web.json_response(bad_request("a prompt or messages").body(), status=400)
        limit = self.params.kv_blocks * self.params.block_size
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": limit})

    async def _tokens_of(self, api: Api, raw: bytes) -> list[int]:
        """The prompt's tokens, as the server's generation path reads them."""
        if self.tokenize_delay_s:
            await asyncio.sleep(self.tokenize_delay_s)
        body = json_object(raw)
        prompt = body.get("prompt")
        is_tokens = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        if api is Api.COMPLETIONS and prompt and is_tokens:
            return prompt
        return self._text_tokens(prompt_of(api, body))

    def _text_tokens(self, text: str) -> list[int]:
        tokenizer = self.tokenizer
        return tokenizer(text) if tokenizer is not None else token_ids(text)

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        context = self.params.kv_blocks * self.params.block_size
        cards = [self._card(name, self.served[0], None, context) for name in self.served]
        cards += [
            self._card(adapter, adapter, self.served[0], context) for adapter in self.lora_adapters
        ]
        return web.json_response({"object": "list", "data": cards})

    def _card(self, name: str, root: str, parent: str | None, context: int) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": context,
            "permission": [
                {
                    "id": f"modelperm-{name}",
                    "object": "model_permission",
                    "created": self._created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def _metrics(self, _: web.Request) -> web.Response:
        assert self.pages is not None
        return web.Response(
            body=self.pages.prometheus_text(), headers={"Content-Type": CONTENT_TYPE}
        )

    async def _iteration_stats(self, _: web.Request) -> web.Response:
        assert self.pages is not None
        return web.json_response(self.pages.iteration_stats())

    def _handler(self, api: Api):
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await self._generate(request, api)
            except RequestError as error:
                return web.json_response(error.body(), status=error.status)

        return handle

    async def _generate(self, request: web.Request, api: Api) -> web.StreamResponse:
        received = time.monotonic()
        model, pages = self.model, self.pages
        assert model is not None and pages is not None
        names = (*self.served, *self.lora_adapters)
        asked = read_request(api, await request.read(), names)
        prompt_tokens = asked.prompt_tokens
        tokens: tuple[int, ...] = ()
        if asked.prompt_text and (self._hasher is not None or self.tokenizer is not None):
            tokens = tuple(self._text_tokens(asked.prompt_text))
            prompt_tokens = len(tokens)
        if asked.previous_response_id is not None:
            context = self._responses.get(asked.previous_response_id)
            if context is None:
                raise RequestError(
                    404,
                    f"Response with id '{asked.previous_response_id}' not found.",
                    "invalid_request_error",
                    "previous_response_id",
                )
            prompt_tokens += context
        limit = self.params.kv_blocks * self.params.block_size
        if prompt_tokens + asked.output_tokens > limit:
            raise RequestError(
                400,
                f"This model's maximum context length is {limit} tokens; the request asks "
                f"for {prompt_tokens + asked.output_tokens}",
                "BadRequestError",
            )
        lora = asked.model if asked.model in self.lora_adapters else None
        kv = asked.kv_transfer_params or {}
        remote_prefill = kv.get("do_remote_prefill") is True
        if remote_prefill:
            await asyncio.sleep(self.kv_transfer.seconds(prompt_tokens))
        if self._hasher is not None:
            count = max(0, prompt_tokens - 1) // self.params.block_size
            blocks = self._hasher.keys(tokens, count, lora)
        else:
            blocks = self._prompt_blocks(asked.prompt_text, prompt_tokens, asked.model)
        pending = model.submit(
            prompt_tokens, asked.output_tokens, lora, remote_prefill, blocks, tokens
        )
        if pending is None:
            raise RequestError(503, "The waiting queue is full.", "ServiceUnavailableError")
        reply = Reply(api, asked.model, prompt_tokens, asked.output_tokens, asked.continuous_usage)
        submitted, entered = model.now(), time.monotonic()
        written: list[float] = []
        try:
            if asked.stream and api is not Api.EMBEDDINGS:
                response = await self._stream(request, reply, pending, asked.include_usage, written)
            else:
                await pending.finished
                reply.cached_tokens = pending.cached_tokens()
                whole = reply.whole()
                if kv.get("do_remote_decode") is True:
                    pages.remote_prefill()
                    whole["kv_transfer_params"] = self._kv_for_remote_decode(reply.request_id)
                response = web.json_response(whole)
        except (asyncio.CancelledError, ConnectionResetError):
            if model.abort(pending):
                self.aborted_total += 1
                pages.aborted()
            raise
        pages.first_token(pending.first_token.result() - submitted)
        pages.finished(
            pending.finished.result() - submitted,
            prompt_tokens,
            asked.output_tokens,
            pending.cached_tokens(),
        )
        if api is Api.RESPONSES:
            self._remember(reply.request_id, prompt_tokens + asked.output_tokens)
        if self.timing is not None:
            done = time.monotonic()
            first = written[0] if written else done
            line = {"id": request.headers.get(REQUEST_ID, ""), "received": received}
            model = {
                "entered": entered,
                "model_first": pending.first_token.result() - submitted,
                "model_done": pending.finished.result() - submitted,
            }
            self.timing.write(json.dumps({**line, "first": first, "done": done, **model}) + "\n")
        return response

    def _prompt_blocks(self, text: str, prompt_tokens: int, model: str) -> tuple[int, ...]:
        """The prompt's cacheable blocks by content: full blocks of
        `block_size` tokens, short of the last token (vLLM computes at least
        one), hashed in a chain seeded with the model."""
        size = self.params.block_size
        blocks = max(0, prompt_tokens - 1) // size
        return block_hashes(text, model, size * CHARS_PER_TOKEN, blocks) if text else ()

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

    def _remember(self, response_id: str, tokens: int) -> None:
        self._responses[response_id] = tokens
        if len(self._responses) > STORED_RESPONSES:
            self._responses.popitem(last=False)

    async def _stream(
        self,
        request: web.Request,
        reply: Reply,
        pending: Pending,
        include_usage: bool,
        written: list[float],
    ) -> web.StreamResponse:
        """The response as SSE; `written` gets when the first token was written."""
        assert self.model is not None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(reply.first_events())
        first = await pending.first_token
        reply.cached_tokens = pending.cached_tokens()
        output_tokens = reply.output_tokens
        sent = 1
        await response.write(reply.token_events(1, 0, output_tokens == 1))
        written.append(time.monotonic())
        step_s = self.params.decode_ms_per_token / 1000.0
        while not pending.finished.done():
            await asyncio.wait([pending.finished], timeout=STREAM_BATCH_S)
            if pending.finished.done():
                break
            decoded = min(output_tokens - 1, 1 + int((self.model.now() - first) / step_s))
            if decoded > sent:
                await response.write(reply.token_events(decoded - sent, sent, False))
                sent = decoded
        if sent < output_tokens:
            await response.write(reply.token_events(output_tokens - sent, sent, True))
        await response.write(reply.final_events(include_usage))
        await response.write_eof()
        return response


if __name__ == "__main__":
    from epp.demo.model_servers import main

    raise SystemExit(main())
