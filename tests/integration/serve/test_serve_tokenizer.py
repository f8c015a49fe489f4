"""The token producer's backends against real servers on loopback (the
simulated vLLM server's render and tokenize endpoints, a tokenizer sidecar
on a Unix socket) and a real tokenizer.json; every failure leaves the
request with its estimate."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from tokenizers import Tokenizer, models, pre_tokenizers

from epp.config.precise import TokenizerBackend, TokenizerSettings
from epp.demo.model_server import SimulatedServer
from epp.demo.server_formats import token_ids
from epp.scheduling.kvblocks import BlockHasher, PreciseConfig
from epp.scheduling.request import InferenceRequest
from epp.serve.tokenizer import (
    INLINE_TOKENS,
    CacheUse,
    LocalTokenizer,
    TokenProducer,
    UdsSidecar,
    backend_for,
)
from epp.sim.server_model import ServerParams
from tests.support.serving import serving

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there " * 30}]}
COMPLETION = {"model": "m", "prompt": "once upon a time " * 30}


def chat_request() -> InferenceRequest:
    return InferenceRequest("m", "m", body=orjson.dumps(CHAT), chat=True, input_tokens=7)


def completion_request() -> InferenceRequest:
    body = orjson.dumps(COMPLETION)
    return InferenceRequest("m", "m", prompt=COMPLETION["prompt"], body=body, input_tokens=7)


@asynccontextmanager
async def vllm_server(**options: object) -> AsyncIterator[str]:
    server = SimulatedServer(ServerParams(), "m", **options)  # type: ignore[arg-type]
    port = await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()


def producer(url: str, timeout: float = 5.0, concurrency: int = 64) -> TokenProducer:
    settings = TokenizerSettings(
        TokenizerBackend.VLLM, "m", url, timeout=timeout, max_concurrency=concurrency
    )
    backend = backend_for(settings)
    assert backend is not None
    return TokenProducer(settings, backend)


@pytest.mark.parametrize("render", [True, False], ids=["render", "tokenize"])
async def test_the_vllm_backend_gets_the_servers_own_tokens(render: bool) -> None:
    async with vllm_server(render_endpoints=render) as url:
        tokens = producer(url)
        chat, completion = chat_request(), completion_request()
        await tokens.tokenize(chat)
        await tokens.tokenize(completion)
        await tokens.close()
    assert chat.token_ids == token_ids("hello there " * 30)
    assert completion.token_ids == token_ids(COMPLETION["prompt"])
    assert completion.input_tokens == len(completion.token_ids)
    assert tokens.stats.tokenized == 2
    assert not tokens.stats.fallbacks


async def test_a_long_prompts_tokens_arrive_whole_over_many_reads() -> None:
    prompt = "abcdefghijklmnop " * 25_000  # 100k tokens: a render reply of about 1 MB
    body = orjson.dumps({"model": "m", "prompt": prompt})
    request = InferenceRequest("m", "m", prompt=prompt, body=body, input_tokens=7)
    async with vllm_server() as url:
        tokens = producer(url)
        await tokens.tokenize(request)
        await tokens.close()
    assert not tokens.stats.fallbacks
    assert request.token_ids == token_ids(prompt)


async def keys_hashed_in(prompt: str) -> tuple[InferenceRequest, set[int]]:
    """A completion of `prompt` tokenized by a server's render endpoint, and
    the threads its block keys were hashed in."""
    precise = PreciseConfig(hasher=BlockHasher(16))
    threads = set()

    def keys(tokens, salt):
        threads.add(threading.get_ident())
        return precise.keys_of(tokens, salt)

    async with vllm_server() as url:
        settings = TokenizerSettings(TokenizerBackend.VLLM, "m", url)
        backend = backend_for(settings)
        assert backend is not None
        tokens = TokenProducer(settings, backend, keys=keys)
        body = orjson.dumps({"model": "m", "prompt": prompt})
        request = InferenceRequest("m", "m", prompt=prompt, body=body)
        await tokens.tokenize(request)
        await tokens.close()
    assert request.kv_block_keys == precise.keys_of(token_ids(prompt))
    assert len(request.kv_block_keys) == len(request.token_ids) // 16
    return request, threads


async def test_a_long_prompts_block_keys_are_hashed_off_the_event_loop() -> None:
    request, threads = await keys_hashed_in("once upon a time " * 4_000)
    assert len(request.token_ids) > INLINE_TOKENS
    assert threads and threading.get_ident() not in threads


async def test_a_short_prompts_block_keys_are_hashed_on_the_event_loop() -> None:
    request, threads = await keys_hashed_in(COMPLETION["prompt"])
    assert len(request.token_ids) <= INLINE_TOKENS
    assert threads == {threading.get_ident()}  # no thread's GIL wait


async def test_a_tokenizer_slower_than_its_timeout_leaves_the_estimate() -> None:
    async with vllm_server(tokenize_delay_s=2.0) as url:
        tokens = producer(url, timeout=0.1)
        request = chat_request()
        await tokens.tokenize(request)
        await tokens.close()
    assert request.token_ids is None
    assert request.input_tokens == 7
    assert tokens.stats.fallbacks == {"timeout": 1}


async def test_a_tokenizer_that_is_down_leaves_the_estimate() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tokens = producer(f"http://127.0.0.1:{port}")
    request = completion_request()
    await tokens.tokenize(request)
    await tokens.close()
    assert request.token_ids is None
    assert tokens.stats.fallbacks == {"error": 1}


async def test_past_its_concurrency_a_request_takes_the_estimate_at_once() -> None:
    async with vllm_server(tokenize_delay_s=0.3) as url:
        tokens = producer(url, concurrency=1)
        first, second = chat_request(), chat_request()
        await asyncio.gather(tokens.tokenize(first), tokens.tokenize(second))
        await tokens.close()
    assert first.token_ids is not None
    assert second.token_ids is None
    assert tokens.stats.fallbacks == {"busy": 1}


def write_tokenizer(directory: Path) -> Tokenizer:
    words = ["once", "upon", "a", "time", "there", "was", "hello"]
    vocabulary = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer


async def test_the_local_backend_tokenizes_with_the_model_directorys_tokenizer_json(
    tmp_path: Path,
) -> None:
    reference = write_tokenizer(tmp_path)
    settings = TokenizerSettings(TokenizerBackend.LOCAL, model_dir=str(tmp_path))
    backend = backend_for(settings)
    assert backend is not None
    tokens = TokenProducer(settings, backend)
    request = completion_request()
    await tokens.tokenize(request)
    await tokens.close()
    assert request.token_ids == reference.encode(COMPLETION["prompt"]).ids
    assert request.token_ids[:4] == [1, 2, 3, 4]


async def test_the_local_backend_encodes_a_long_prompt_off_the_event_loop(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    local = LocalTokenizer(str(tmp_path))
    request = InferenceRequest("m", "m", prompt="once upon a time " * 25_000)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    tokens = await local.tokens(request)
    ticker.cancel()
    await local.close()
    assert len(tokens) == 100_000
    assert ticks > 2  # the loop ran while the encode was under way


async def test_the_local_backend_encodes_a_short_prompt_on_the_event_loop(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    local = LocalTokenizer(str(tmp_path))
    threads: set[int] = set()
    recording_encodes(local, threads)
    tokens = await local.tokens(completion_request())
    await local.close()
    assert len(tokens) == 120
    assert threads == {threading.get_ident()}


def recording_encodes(local: LocalTokenizer, threads: set[int] | None = None) -> list[str]:
    """The texts `local` encodes from now on (and, into `threads`, the
    threads it encodes them on)."""
    encoded: list[str] = []
    encode = local.encode_with_ends

    def recording(
        text: str, special: bool = True, release: bool = False
    ) -> tuple[list[int], list[int]]:
        encoded.append(text)
        if threads is not None:
            threads.add(threading.get_ident())
        return encode(text, special, release)

    local.encode_with_ends = recording  # type: ignore[method-assign]
    return encoded


async def test_a_prompt_mostly_tokenized_before_is_routed_on_those_tokens_without_an_encode(
    tmp_path: Path,
) -> None:
    reference = write_tokenizer(tmp_path)
    settings = TokenizerSettings(TokenizerBackend.LOCAL, model_dir=str(tmp_path))
    local = LocalTokenizer(str(tmp_path))
    encoded = recording_encodes(local)
    producer = TokenProducer(settings, local)
    system = "once upon a time there was " * 60  # 1,620 characters, 360 tokens
    first = InferenceRequest("m", "m", prompt=system + "hello")
    second = InferenceRequest("m", "m", prompt=system + "hello there was a time")
    await producer.tokenize(first)
    await producer.tokenize(second)
    await producer.close()
    assert encoded == [first.prompt]  # 1,536 of the second's 1,642 characters were held
    held = reference.encode(system[:1536]).ids
    assert second.token_ids == held[: len(second.token_ids or ())]
    assert len(second.token_ids or ()) >= len(held) - 1
    assert second.input_tokens == pytest.approx(len(reference.encode(second.prompt).ids), rel=0.1)


async def test_a_prompt_partly_tokenized_before_is_routed_at_once_and_its_rest_encoded_after(
    tmp_path: Path,
) -> None:
    reference = write_tokenizer(tmp_path)
    local = LocalTokenizer(str(tmp_path))
    encoded = recording_encodes(local)
    system = "once upon a time there was " * 60  # 1,620 characters, 360 tokens
    first = system + "hello"
    second = system + "hello there was a time" * 30  # 1,536 of 2,285 characters held
    assert (
        await local.tokens(InferenceRequest("m", "m", prompt=first)) == reference.encode(first).ids
    )
    routed = await local.tokens(InferenceRequest("m", "m", prompt=second))
    assert encoded == [first]  # routed on the store's tokens, nothing encoded yet
    assert routed == reference.encode(second).ids[: len(routed)] and len(routed) > 300
    await local.learned()
    assert len(encoded) == 2 and len(encoded[1]) < 800  # then its tail, from 8 tokens back
    found = local.store.find(second)
    await local.close()
    assert found is not None and found.chars == len(second) // 256 * 256  # every block
    assert found.tokens == reference.encode(second).ids[: len(found.tokens)]


async def test_past_its_learning_limit_a_prompt_is_routed_on_the_stores_tokens_unlearned(
    tmp_path: Path,
) -> None:
    write_tokenizer(tmp_path)
    local = LocalTokenizer(str(tmp_path), max_learning=0)
    encoded = recording_encodes(local)
    system = "once upon a time there was " * 60
    await local.tokens(InferenceRequest("m", "m", prompt=system + "hello"))
    routed = await local.tokens(InferenceRequest("m", "m", prompt=system + "hello there" * 80))
    await local.learned()
    await local.close()
    assert len(encoded) == 1 and len(routed) > 300  # the second prompt's rest was not encoded
    assert local.caches()["learning"] == CacheUse(0, 0, 1)


CONFIG_LOCAL = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{modelName: m, local: {{modelDir: "{folder}"}}}}
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer}}]
"""


async def test_the_token_producers_caches_at_their_limits_drop_and_say_so_on_the_metrics_page(
    tmp_path: Path,
) -> None:
    write_tokenizer(tmp_path)
    config = tmp_path / "epp.yaml"
    config.write_text(CONFIG_LOCAL.format(folder=tmp_path))
    async with serving(
        config_file=str(config),
        endpoints="127.0.0.1:8000",
        token_store_blocks=3,
        digest_memo_entries=10,
    ) as server:
        request = InferenceRequest("m", "m", prompt="once upon a time " * 100)  # 6 blocks
        await server.token_producer.tokenize(request)
        assert len(request.token_ids or ()) == 400  # 25 blocks of 16 tokens
        text = server.metrics.exposition().decode()
    family = "llm_d_epp_token_producer_cache_"
    for line in (
        'entries{cache="prefix-store"} 3.0',
        'capacity{cache="prefix-store"} 3.0',
        'dropped_total{cache="prefix-store"} 3.0',
        'entries{cache="digest-memo"} 5.0',  # started over at the 11th of 25 and the 21st
        'capacity{cache="digest-memo"} 10.0',
        'dropped_total{cache="digest-memo"} 20.0',
        'capacity{cache="learning"} 4.0',
    ):
        assert family + line in text, line


async def test_a_conversations_turns_spliced_into_the_store_are_the_whole_prompts_tokens(
    tmp_path: Path,
) -> None:
    import random

    from epp.demo.tokenizer_file import train

    rng = random.Random(28)

    def words(count: int) -> str:
        return " ".join(
            rng.choice(["lorem", "ipsum", "dolor", "sit", "amet,"]) for _ in range(count)
        )

    prompts = [words(400)]
    for _ in range(3):  # each turn adds over a fifth: its rest is encoded after it is routed
        prompts.append(prompts[-1] + "\nuser: " + words(len(prompts[-1]) // 12))
    train(tmp_path, prompts)
    whole = LocalTokenizer(str(tmp_path))
    local = LocalTokenizer(str(tmp_path))
    encoded = recording_encodes(local)
    for prompt in prompts:
        routed = await local.tokens(InferenceRequest("m", "m", prompt=prompt))
        assert routed == whole.encode(prompt)[: len(routed)]
        await local.learned()
        found = local.store.find(prompt)
        assert found is not None and found.chars == len(prompt) // 256 * 256  # every block
        assert found.tokens == whole.encode(prompt)[: len(found.tokens)]
    await local.close()
    await whole.close()
    assert len(encoded) == 4
    assert sum(map(len, encoded)) < 1.5 * len(prompts[-1])  # not every turn whole


def test_a_model_directory_without_tokenizer_json_is_refused_at_start(tmp_path: Path) -> None:
    from epp.serve.tokenizer import TokenizeError

    with pytest.raises(TokenizeError, match=r"tokenizer\.json"):
        LocalTokenizer(str(tmp_path))


@asynccontextmanager
async def uds_sidecar(path: Path, tokenizer: Tokenizer) -> AsyncIterator[None]:
    """The reference's tokenizer sidecar protocol (llm-d-kv-cache-manager,
    services/uds_tokenizer/server.py): /chat-template renders messages to
    text, /tokenize answers input_ids."""

    async def template(request: web.Request) -> web.Response:
        messages = json.loads(await request.read())
        return web.Response(text=" ".join(m["content"] for m in messages))

    async def tokenize(request: web.Request) -> web.Response:
        text = (await request.read()).decode()
        return web.json_response({"input_ids": tokenizer.encode(text).ids})

    app = web.Application()
    app.router.add_post("/chat-template", template)
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def test_the_uds_backend_asks_the_tokenizer_sidecar(tmp_path: Path) -> None:
    reference = write_tokenizer(tmp_path)
    path = tmp_path / "tokenizer.sock"
    async with uds_sidecar(path, reference):
        backend = UdsSidecar(str(path))
        settings = TokenizerSettings(TokenizerBackend.UDS, socket_file=str(path))
        tokens = TokenProducer(settings, backend)
        chat = InferenceRequest(
            "m",
            "m",
            body=orjson.dumps({"messages": [{"role": "user", "content": "hello there"}]}),
            chat=True,
        )
        await tokens.tokenize(chat)
        await tokens.close()
    assert chat.token_ids == reference.encode("hello there").ids
