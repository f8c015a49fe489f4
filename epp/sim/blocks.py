"""Block keys of simulated prompts, at any block size.

The simulator models a prompt by its shape, not its text: a tenant's shared
prefix (`prefix.tokens` of its group, for its model or adapter), then, for
a conversation's turn, the conversation so far, else tokens of the
request's own. So a prompt's content up to its token e is fixed by who owns
token e - 1: the prefix group (e within the prefix), the conversation, or
the request. Block b (tokens [b x size, (b + 1) x size)) is keyed by that
owner and b, and two prompts share block b exactly when they share every
token up to its end, as chained block hashes do (vLLM's keys, the EPP's
approximate hashes): the same relation at whatever block size the reader
cuts the prompt into.

A key is `owner << 24 | b`, the owner numbered 3g + 1 for prefix group g,
3c + 2 for conversation c, 3r + 3 for request r, so the owners' keys never
meet (a prompt has fewer than 2^24 blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from itertools import chain
from typing import Any

from epp.serve.token_store import BLOCK_CHARS, CAPACITY, MIN_OVERLAP

BLOCK_BITS = 24
CHARS_PER_TOKEN = 4


def _base(owner: int) -> int:
    return owner << BLOCK_BITS


def block_keys(
    size: int,
    prompt_tokens: int,
    prefix_tokens: int = 0,
    group: int = -1,
    conversation: int = -1,
    request: int = 0,
    max_blocks: int | None = None,
) -> tuple[int, ...]:
    """The keys of the prompt's full blocks of `size` tokens (at most
    `max_blocks`): `prefix_tokens` of prefix group `group` (-1: none) lead,
    the rest belongs to `conversation` (-1: none), else to `request`."""
    count = prompt_tokens // size
    if max_blocks is not None:
        count = min(count, max_blocks)
    shared = min(min(prefix_tokens, prompt_tokens) // size, count) if group >= 0 else 0
    own = _base(3 * conversation + 2) if conversation >= 0 else _base(3 * request + 3)
    if not shared:
        return tuple(range(own, own + count))
    first = _base(3 * group + 1)
    return tuple(chain(range(first, first + shared), range(own + shared, own + count)))


class TokenStoreModel:
    """The token producer's prefix store (`epp.serve.token_store`) over
    simulated prompts: their blocks of BLOCK_CHARS characters (at
    CHARS_PER_TOKEN) by content key, at most CAPACITY, the least recently
    used leaving first. `covered(request)`: the share of the prompt's tokens
    in its leading blocks held (0: the producer encodes it before routing,
    else after, off the request's path); below MIN_OVERLAP the store holds
    its blocks from then on, as the live one does once it is encoded."""

    __slots__ = ("_blocks", "_keys_of", "block_tokens", "capacity")

    def __init__(
        self,
        keys_of: Callable[[Any, int], tuple[int, ...]],
        block_tokens: int = BLOCK_CHARS // CHARS_PER_TOKEN,
        capacity: int = CAPACITY,
    ) -> None:
        self._keys_of = keys_of
        """A request's block keys at a block size (`Simulation.keys_of`)."""
        self.block_tokens = block_tokens
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def covered(self, request: Any) -> float:
        keys = self._keys_of(request, self.block_tokens)
        blocks = self._blocks
        held = 0
        for key in keys:
            if key not in blocks:
                break
            blocks.move_to_end(key)
            held += 1
        share = held * self.block_tokens / request.prompt_tokens if request.prompt_tokens else 0.0
        if share < MIN_OVERLAP:
            for key in keys[held:]:
                blocks[key] = None
            while len(blocks) > self.capacity:
                blocks.popitem(last=False)
        return share
