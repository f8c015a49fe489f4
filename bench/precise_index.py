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
the tests build) on the prompt's text, in process.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from epp.scheduling.kvblocks import BlockHasher, KVBlockIndex

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


def tokenizing(tokens: int) -> float:
    """Seconds the local backend's tokenizer takes for a `tokens`-word prompt."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(5000)]
    vocab = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tokenizer.json"
        tokenizer.save(str(path))
        loaded = Tokenizer.from_file(str(path))
    text = " ".join(random.choice(words) for _ in range(tokens))
    return best_of(lambda: loaded.encode(text), repeat=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    random.seed(28)
    result = {
        "memory": memory(options.blocks),
        "requests": [
            {**per_request(tokens, options.blocks), "tokenize_s": tokenizing(tokens)}
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


if __name__ == "__main__":
    main()
