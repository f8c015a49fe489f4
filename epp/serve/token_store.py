"""The token producer's prefix store: the token ids of prompts tokenized
before, found again by their text, so that a prompt whose text mostly
repeats one seen before (a shared system prompt, a conversation's earlier
turns) is not tokenized again. As in llm-d-kv-cache-manager's prefix store
(`pkg/tokenization/prefixstore/lru_store.go`) and its tokenization pool:

- A prompt's text is cut into blocks of `block_chars` characters, each keyed
  by a chained hash (a block's key covers all the text before it), so two
  prompts share a block's key exactly when they share the text up to its end.
- A block holds the tokens that end inside it (a token that straddles a
  block's end belongs to the next block), so the tokens of a run of leading
  blocks are the tokens of that text.
- `find` walks a prompt's blocks to the first one not held; when the blocks
  found cover at least `min_overlap` of the prompt, the producer routes on
  their tokens alone (the uncovered tail, at most a fifth of the prompt, is
  not hashed: its blocks are not yet cached anywhere the prefix is not)
  instead of tokenizing the prompt; else it tokenizes and `add`s it.
- Bounded: at most `capacity` blocks, the least recently used leaving first.

A token's boundaries can depend on the text after it (a word cut by a
block's end); the store takes the tokens of the prompt it saw, as the
reference does, which can differ from the whole prompt's in the last
block found: at most one block key of the route differs from the server's.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_CHARS = 256
CAPACITY = 500_000
"""Blocks held: about 64 tokens a block of text, held as
4-byte ids (about 450 bytes a block with its entry, `bench/README.md`)."""
MIN_OVERLAP = 0.8


@dataclass(slots=True, frozen=True)
class Found:
    """The tokens of a prompt's leading `chars` characters."""

    tokens: list[int]
    chars: int


class PrefixTokenStore:
    __slots__ = ("_blocks", "block_chars", "capacity", "min_overlap")

    def __init__(
        self,
        block_chars: int = BLOCK_CHARS,
        capacity: int = CAPACITY,
        min_overlap: float = MIN_OVERLAP,
    ) -> None:
        self.block_chars = block_chars
        self.capacity = capacity
        self.min_overlap = min_overlap
        self._blocks: OrderedDict[int, array[int]] = OrderedDict()
        """A block's chained key -> the tokens that end inside it; oldest used first."""

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
        for key, end in self._keys(text):
            stop = bisect_right(ends, end, start)
            # 4-byte ids, not a tuple of int objects (28 bytes each plus the slot).
            blocks[key] = array("I", tokens[start:stop])
            blocks.move_to_end(key)
            start = stop
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def find(self, text: str) -> Found | None:
        """The tokens of `text`'s longest run of leading blocks held, when
        they cover at least `min_overlap` of it; else None."""
        blocks = self._blocks
        tokens: list[int] = []
        chars = 0
        for key, end in self._keys(text):
            block = blocks.get(key)
            if block is None:
                break
            blocks.move_to_end(key)
            tokens.extend(block)
            chars = end
        if not text or chars < self.min_overlap * len(text):
            return None
        return Found(tokens, chars)
