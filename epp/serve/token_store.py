"""The token producer's prefix store: the token ids of prompts tokenized
before, found again by their text, so that a prompt whose text repeats one
seen before (a shared system prompt, a conversation's earlier turns) is
tokenized only past what repeats. After llm-d-kv-cache-manager's prefix
store (`pkg/tokenization/prefixstore/lru_store.go`):

- A prompt's text is cut into blocks of `block_chars` characters, each keyed
  by a chained hash (a block's key covers all the text before it), so two
  prompts share a block's key exactly when they share the text up to its end.
- A block holds the tokens that end inside it and where each ends (a token
  that straddles a block's end belongs to the next block), so the tokens of
  a run of leading blocks are the tokens of that text.
- `find` walks a prompt's blocks to the first one not held and gives the
  tokens of the run, which the producer routes on (the tail's blocks go
  unkeyed: the new part of a conversation's turn, or a request's own text
  after a shared prompt). The reference does so when they cover
  MIN_OVERLAP of the prompt and else encodes it whole first; epp's local
  backend encodes the rest after routing, from a few tokens back, splices
  the two where they agree (`epp.serve.tokenizer.LocalTokenizer`) and adds
  the prompt, so a conversation's next turn finds this one.
- Bounded: at most `capacity` blocks (`--token-store-blocks`), the least
  recently used leaving first, counted in `evictions`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_CHARS = 256
MIN_OVERLAP = 0.8
"""A prompt covered this far by the blocks found is not encoded at all (the
reference's `minPrefixOverlapRatio`); covered less, its rest is encoded
after it is routed."""
CAPACITY = 300_000
"""Blocks held: about 64 tokens a block of text, held as 4-byte ids with
2-byte ends, 710 bytes a block with its entry (`bench/README.md`), so about
210 MB (the reference holds 500,000 blocks of ids without their ends)."""
MAX_LEARNING = 4
"""Prompts encoded off their requests' path at once; past it a prompt is
routed on the store's tokens and not learned."""
DIGEST_MEMO_ENTRIES = 50_000
"""Block digests the token producer remembers (`epp.scheduling.kvblocks.DigestMemo`,
about 800 bytes each: 40 MB)."""


@dataclass(slots=True, frozen=True)
class TokenCacheLimits:
    """What the token producer may hold, per process (each protocol worker
    tokenizes with its own): the flags `--token-store-blocks`,
    `--digest-memo-entries` and `--tokenizer-max-learning`."""

    store_blocks: int = CAPACITY
    memo_digests: int = DIGEST_MEMO_ENTRIES
    max_learning: int = MAX_LEARNING


DEFAULT_LIMITS = TokenCacheLimits()


@dataclass(slots=True, frozen=True)
class Found:
    """The tokens of a prompt's leading `chars` characters and where each
    ends in it."""

    tokens: list[int]
    ends: list[int]
    chars: int


class PrefixTokenStore:
    __slots__ = ("_blocks", "block_chars", "capacity", "evictions")

    def __init__(self, block_chars: int = BLOCK_CHARS, capacity: int = CAPACITY) -> None:
        self.block_chars = block_chars
        self.capacity = capacity
        self.evictions = 0
        """Blocks dropped for room, since the start."""
        self._blocks: OrderedDict[int, tuple[array[int], array[int]]] = OrderedDict()
        """A block's chained key -> the tokens that end inside it and where
        each ends past the block's start; the least recently used first."""

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, text: str) -> list[tuple[int, int]]:
        """(key, end) of each full block of `text`."""
        size, key, keys = self.block_chars, 0, []
        for end in range(size, len(text) + 1, size):
            key = hash((key, text[end - size : end]))
            keys.append((key, end))
        return keys

    def add(self, text: str, tokens: Sequence[int], ends: Sequence[int]) -> None:
        """Hold the tokens of `text` (`ends[i]`: where token i ends in it)."""
        blocks = self._blocks
        start = 0
        size = self.block_chars
        for key, end in self._keys(text):
            stop = bisect_right(ends, end, start)
            # 4-byte ids and 2-byte ends (from the block's start: at most
            # its size), not tuples of int objects (28 bytes each plus the slot)
            base = end - size
            blocks[key] = (
                array("I", tokens[start:stop]),
                array("H", [e - base for e in ends[start:stop]]),
            )
            blocks.move_to_end(key)
            start = stop
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
            self.evictions += 1

    def find(self, text: str) -> Found | None:
        """The tokens of `text`'s longest run of leading blocks held (None:
        not its first block)."""
        blocks = self._blocks
        tokens: list[int] = []
        ends: list[int] = []
        chars = 0
        for key, end in self._keys(text):
            block = blocks.get(key)
            if block is None:
                break
            blocks.move_to_end(key)
            tokens.extend(block[0])
            base = end - self.block_chars
            ends.extend([e + base for e in block[1]])
            chars = end
        return Found(tokens, ends, chars) if chars else None
