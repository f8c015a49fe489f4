"""The precise prefix cache's costs: the index's memory per cached block, and
per request the block keys' hashing, the index lookup and the local
tokenizer, at 1k- and 100k-token prompts.

    python3 -m bench.precise_index [--blocks N] [--json]

Memory: `tracemalloc` over filling a `KVBlockIndex` with N block keys, each
held by one endpoint (of 8), then with a second endpoint holding every key
too (two holders a key). Lookup: `KVBlockIndex.matches` of a prompt whose
leading half is held by three endpoints, in an index of N keys. Hashing:
`BlockHasher.keys` (sha256_cbor, vLLM's default) of the prompt's tokens.
Tokenizing: the local backend (a `tokenizers` word-level tokenizer.json, as
the tests build) on the prompt's text, in process. The token producer, end
to end as `epp serve` runs it (`TokenProducer.tokenize`: the tokens, then
the block keys in a worker thread), per request: the vllm backend's render
round trip to an idle simulated vLLM server on loopback, and the local
backend; the samples' median and 90th percentile, and the samples
themselves (`--json`: what a scenario's `epp.token_producer_ms` draws from).
The local backend again on a loop busy with other work (`on_a_busy_loop`),
as `epp serve` runs it (a short prompt on the loop) and always in threads,
alternating request by request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson

from epp.config.precise import TokenizerBackend, TokenizerSettings
from epp.demo.model_server import SimulatedServer
from epp.scheduling.kvblocks import BlockHasher, KVBlockIndex
from epp.scheduling.request import InferenceRequest
from epp.serve.tokenizer import LocalTokenizer, TokenProducer, VLLMRender
from epp.sim.server_model import ServerParams

ENDPOINTS = [f"10.0.0.{i}:8000" for i in range(1, 9)]


def best_of(function: Callable[[], object], repeat: int = 5, number: int = 0) -> float:
    """Seconds per call, the best of `repeat` rounds of `number` calls
    (0: enough calls for about 0.2 s a round)."""
    if number == 0:
        start = time.perf_counter()
        function()
        once = max(time.perf_counter() - start, 1e-7)
        number = max(1, int(0.2 / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            function()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def memory(blocks: int) -> dict[str, float]:
    keys = [random.getrandbits(64) for _ in range(blocks)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = KVBlockIndex(size=blocks * 2)
    for start in range(0, blocks, 64):
        index.store(ENDPOINTS[(start // 64) % len(ENDPOINTS)], keys[start : start + 64])
    one = tracemalloc.get_traced_memory()[0] - base
    for start in range(0, blocks, 64):
        index.store(ENDPOINTS[(start // 64 + 1) % len(ENDPOINTS)], keys[start : start + 64])
    two = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "blocks": blocks,
        "bytes_per_block_one_holder": one / blocks,
        "bytes_per_block_two_holders": two / blocks,
        "bytes_per_extra_holder": (two - one) / blocks,
    }


def per_request(tokens: int, blocks_in_index: int) -> dict[str, float]:
    hasher = BlockHasher(16)
    prompt = [random.randrange(150_000) for _ in range(tokens)]
    keys = hasher.keys(prompt)
    index = KVBlockIndex(size=blocks_in_index + len(keys))
    filler = [random.getrandbits(64) for _ in range(blocks_in_index)]
    for start in range(0, len(filler), 64):
        index.store(ENDPOINTS[(start // 64) % len(ENDPOINTS)], filler[start : start + 64])
    for endpoint in ENDPOINTS[:3]:
        index.store(endpoint, keys[: len(keys) // 2])
    return {
        "tokens": tokens,
        "blocks": len(keys),
        "hash_s": best_of(lambda: hasher.keys(prompt)),
        "lookup_s": best_of(lambda: index.matches(keys)),
    }


WORDS = [f"w{i}" for i in range(5000)]


def word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer.json over WORDS in `folder` (a model directory)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def tokenizing(tokens: int) -> float:
    """Seconds the local backend's tokenizer takes for a `tokens`-word prompt."""
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as folder:
        loaded = Tokenizer.from_file(str(word_tokenizer(Path(folder)) / "tokenizer.json"))
    text = " ".join(random.choice(WORDS) for _ in range(tokens))
    return best_of(lambda: loaded.encode(text), repeat=3)


async def producer_seconds(producer: TokenProducer, text: str, count: int) -> list[float]:
    """Seconds of each of `count` sequential `tokenize` calls on a prompt of `text`."""
    body = orjson.dumps({"model": "model", "prompt": text, "max_tokens": 1})
    samples = []
    for _ in range(count):
        request = InferenceRequest("model", "model", text, body=body)
        started = time.perf_counter()
        await producer.tokenize(request)
        samples.append(time.perf_counter() - started)
        if request.kv_block_keys is None:
            raise RuntimeError(f"the token producer fell back: {dict(producer.stats.fallbacks)}")
    return samples


async def producers(tokens: int, count: int) -> dict[str, list[float]]:
    """Per-request seconds of the vllm backend (render, an idle simulated
    server on loopback) and the local backend, for a `tokens`-token prompt."""
    keys = BlockHasher(16).keys
    server = SimulatedServer(ServerParams(), "model")
    port = await server.start("127.0.0.1")
    try:
        settings = TokenizerSettings(TokenizerBackend.VLLM, "model", f"http://127.0.0.1:{port}")
        render = TokenProducer(settings, VLLMRender(settings.url, "model"), keys=keys)
        text = "".join(random.choice("abcdefghijklmnop ") for _ in range(tokens * 4))
        try:
            rendered = await producer_seconds(render, text, count)
        finally:
            await render.close()
    finally:
        await server.stop()
    with tempfile.TemporaryDirectory() as folder:
        settings = TokenizerSettings(TokenizerBackend.LOCAL, "model", model_dir=folder)
        local = TokenProducer(
            settings, LocalTokenizer(str(word_tokenizer(Path(folder)))), keys=keys
        )
        text = " ".join(random.choice(WORDS) for _ in range(tokens))
        try:
            tokenized = await producer_seconds(local, text, count)
        finally:
            await local.close()
        busy = await on_a_busy_loop(folder, text, count)
    return {"vllm_render_s": rendered, "local_s": tokenized, **busy}


BUSY_TASKS = 3
BUSY_WORK = 20_000
"""The busy loop's stand-in for other streams: BUSY_TASKS tasks, each summing
range(BUSY_WORK) (about 0.3 ms) between yields."""


async def on_a_busy_loop(folder: str, text: str, count: int) -> dict[str, list[float]]:
    """Per-request seconds of the local backend on a loop that is busy with
    other work, as the EPP's is under load: as `epp serve` runs it (a short
    prompt encoded and its keys hashed on the loop) and always in threads,
    the two alternating request by request."""
    keys = BlockHasher(16).keys
    settings = TokenizerSettings(TokenizerBackend.LOCAL, "model", model_dir=folder)
    served = TokenProducer(settings, LocalTokenizer(folder), keys=keys)
    threaded = TokenProducer(
        settings, LocalTokenizer(folder, inline_chars=0), keys=keys, inline_tokens=0
    )
    stop = asyncio.Event()

    async def other_streams() -> None:
        while not stop.is_set():
            sum(range(BUSY_WORK))
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(other_streams()) for _ in range(BUSY_TASKS)]
    samples: dict[str, list[float]] = {"local_busy_s": [], "local_busy_threads_s": []}
    try:
        for _ in range(count):
            for name, producer in (("local_busy_s", served), ("local_busy_threads_s", threaded)):
                samples[name] += await producer_seconds(producer, text, 1)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await served.close()
        await threaded.close()
    return samples


def quantiles(samples: list[float]) -> tuple[float, float]:
    """(median, 90th percentile) of `samples`."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40, help="token-producer calls per size")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    random.seed(28)
    result = {
        "memory": memory(options.blocks),
        "requests": [
            {
                **per_request(tokens, options.blocks),
                "tokenize_s": tokenizing(tokens),
                **asyncio.run(producers(tokens, options.requests)),
            }
            for tokens in (1_000, 100_000)
        ],
    }
    if options.json:
        print(json.dumps(result, indent=2))
        return
    m = result["memory"]
    print(
        f"index of {m['blocks']:,} blocks: {m['bytes_per_block_one_holder']:.0f} B a block "
        f"(one holder), {m['bytes_per_block_two_holders']:.0f} B (two), "
        f"{m['bytes_per_extra_holder']:.0f} B an extra holder"
    )
    for r in result["requests"]:
        print(
            f"{r['tokens']:>7,} tokens ({r['blocks']:,} blocks): hash {r['hash_s'] * 1e3:.3f} ms, "
            f"lookup {r['lookup_s'] * 1e6:.1f} us, tokenize {r['tokenize_s'] * 1e3:.3f} ms"
        )
        for backend in ("vllm_render_s", "local_s", "local_busy_s", "local_busy_threads_s"):
            p50, p90 = quantiles(r[backend])
            print(
                f"{'':>7}  token producer, {backend[:-2].replace('_', ' ')}: "
                f"p50 {p50 * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms"
            )


if __name__ == "__main__":
    main()
