"""Prefix-cache affinity: chained block hashes and which endpoint holds which.

A prompt is cut into blocks of `block_chars` characters (only full blocks,
at most `max_blocks`). Block i's hash covers the block and, through the
previous hash, everything before it:

    h_-1 = xxh64(utf8(target model name), seed=0)
    h_i  = xxh64(utf8(block_i), seed=h_i-1)

(`xxh64_intdigest(block, previous)`), so two prompts share block hash i
exactly when they share their first i+1 blocks (for the same model). This is
the reference EPP's approximate prefix cache: the EPP does not see the model
server's cache, it remembers where it sent which prefixes. The reference
chains by hashing the block followed by the previous hash's 8 bytes; seeding
with it chains the same way without building a new byte string per block.
The values differ from the reference's, which nothing outside this process
ever sees.

`PrefixIndex` keeps, per endpoint, an LRU of the block hashes it was sent
(bounded by `capacity`), and which endpoints hold each chain's first block.
A prompt's blocks are recorded deepest first, so an endpoint's copy of block
i is never older than its copy of block i+1, and the LRU evicts deep blocks
before their prefix. Hence an endpoint holding block i holds every block
before it: the blocks an endpoint holds of a chain are a leading run, and
its match length (blocks matched up to its first miss) is found by binary
search. The endpoints that hold a chain's first block are the only ones
with a match; they are searched together, split at each probe into those
holding the probed block and the rest, so matching costs O(log blocks)
membership tests per holder and nothing for endpoints without the prefix.
Recording costs one binary search, then bulk LRU operations (new blocks
appended, held ones moved to the end, the oldest evicted).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import itemgetter

from xxhash import xxh64_intdigest

_second = itemgetter(1)


def block_hashes(prompt: str, model: str, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of `prompt`, seeded with `model`."""
    count = min(len(prompt) // block_chars, max_blocks)
    previous = xxh64_intdigest(model.encode())
    starts = range(0, count * block_chars, block_chars)
    if prompt.isascii():  # one byte per character: encode once, slice bytes
        data = prompt.encode()
        chunks = [data[start : start + block_chars] for start in starts]
    else:
        chunks = [prompt[start : start + block_chars].encode() for start in starts]
    hashes = []
    for chunk in chunks:
        previous = xxh64_intdigest(chunk, previous)
        hashes.append(previous)
    return tuple(hashes)


def held_blocks(lru: Mapping[int, object], hashes: Sequence[int]) -> int:
    """How many leading blocks of `hashes` are in `lru` (a leading run, by
    the nesting property)."""
    if hashes[0] not in lru:
        return 0
    count = len(hashes)
    if hashes[-1] in lru:
        return count
    lo, hi = 1, count - 1  # held: at least lo blocks, at most hi
    while lo < hi:
        middle = (lo + hi + 1) // 2
        if hashes[middle - 1] in lru:
            lo = middle
        else:
            hi = middle - 1
    return lo


class PrefixIndex:
    """Per-endpoint LRUs of block hashes, and the holders of each chain's
    first block (see the module docstring). An LRU maps a block to whether
    it is a chain's first block. Holder sets are immutable; an endpoint's
    set of itself alone is shared by every first block only it holds."""

    __slots__ = ("_alone", "_lrus", "_roots", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"prefix LRU capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._lrus: dict[str, OrderedDict[int, bool]] = {}
        self._roots: dict[int, frozenset[str]] = {}
        self._alone: dict[str, frozenset[str]] = {}

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        """`endpoint` was sent a prompt with these chained block hashes (in
        prompt order)."""
        lru = self._lrus.get(endpoint)
        if lru is None:
            lru = self._lrus[endpoint] = OrderedDict()
            self._alone[endpoint] = frozenset((endpoint,))
        if not hashes:
            return
        held = held_blocks(lru, hashes)
        if not held:
            for block in hashes[:0:-1]:
                lru[block] = False
            root = hashes[0]
            lru[root] = True
            alone = self._alone[endpoint]
            holders = self._roots.get(root)
            self._roots[root] = alone if holders is None else holders | alone
        else:
            for block in hashes[: held - 1 : -1]:
                lru[block] = False
            deque(map(lru.move_to_end, hashes[held - 1 :: -1]), 0)
        excess = len(lru) - self.capacity
        if excess > 0:
            for root, _ in filter(_second, map(lru.popitem, repeat(False, excess))):
                self._drop_root(endpoint, root)

    def matches(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each endpoint holding the first block: how many leading blocks
        it holds (matching stops at the first block it misses)."""
        first = self._roots.get(hashes[0]) if hashes else None
        if not first:
            return {}
        lrus = self._lrus
        matched: dict[str, int] = {}
        # (group, lo, hi): every endpoint of group holds block lo, none beyond hi.
        pending = [([(endpoint, lrus[endpoint]) for endpoint in first], 0, len(hashes) - 1)]
        while pending:
            group, lo, hi = pending.pop()
            while lo < hi:
                middle = (lo + hi + 1) // 2
                block = hashes[middle]
                deeper = [entry for entry in group if block in entry[1]]
                if not deeper:
                    hi = middle - 1
                    continue
                if len(deeper) < len(group):
                    shallower = [entry for entry in group if block not in entry[1]]
                    pending.append((shallower, lo, middle - 1))
                    group = deeper
                lo = middle
            for endpoint, _ in group:
                matched[endpoint] = lo + 1
        return matched

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything recorded for `endpoint`."""
        lru = self._lrus.pop(endpoint, None)
        if lru is not None:
            for root in compress(lru, lru.values()):
                self._drop_root(endpoint, root)
            del self._alone[endpoint]

    def endpoints(self) -> set[str]:
        return set(self._lrus)

    def size(self, endpoint: str) -> int:
        lru = self._lrus.get(endpoint)
        return len(lru) if lru is not None else 0

    def _drop_root(self, endpoint: str, root: int) -> None:
        alone = self._alone[endpoint]
        holders = self._roots[root]
        if holders is alone:
            del self._roots[root]
        elif holders := holders - alone:
            self._roots[root] = holders
        else:
            del self._roots[root]
