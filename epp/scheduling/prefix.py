"""Prefix-cache affinity: chained block hashes and which endpoint holds which.

A prompt is cut into blocks of `block_chars` characters (only full blocks,
at most `max_blocks`). Block i's hash covers the block and, through the
previous hash, everything before it:

    h_-1 = xxh64(target model name)
    h_i  = xxh64(utf8(block_i) + little-endian uint64(h_i-1))

so two prompts share block hash i exactly when they share their first i+1
blocks (for the same model). This is the reference EPP's approximate prefix
cache: the EPP does not see the model server's cache, it remembers where it
sent which prefixes.

`PrefixIndex` keeps, per endpoint, an LRU of the block hashes it was sent
(bounded by `capacity`), and a reverse map hash -> endpoints. A prompt's
blocks are recorded deepest first, so an endpoint's copy of block i is never
older than its copy of block i+1, and the LRU evicts deep blocks before
their prefix. Hence an endpoint holding block i holds every block before it,
the holders of a chain's blocks are nested, and an endpoint's match length
(blocks matched up to its first miss) is found by binary search: matching
costs O(log blocks) set operations per distinct match length, not one
lookup per endpoint and block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from struct import Struct

from xxhash import xxh64_intdigest

_pack_le_uint64 = Struct("<Q").pack


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
        previous = xxh64_intdigest(chunk + _pack_le_uint64(previous))
        hashes.append(previous)
    return tuple(hashes)


class PrefixIndex:
    """Per-endpoint LRUs of block hashes with a reverse index."""

    __slots__ = ("_holders", "_lrus", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"prefix LRU capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._lrus: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        """`endpoint` was sent a prompt with these block hashes (in prompt order)."""
        lru = self._lrus.get(endpoint)
        if lru is None:
            lru = self._lrus[endpoint] = OrderedDict()
        holders = self._holders
        for block in reversed(hashes):
            if block in lru:
                lru.move_to_end(block)
                continue
            lru[block] = None
            holder_set = holders.get(block)
            if holder_set is None:
                holders[block] = {endpoint}
            else:
                holder_set.add(endpoint)
            if len(lru) > self.capacity:
                self._forget(endpoint, lru.popitem(last=False)[0])

    def matches(self, hashes: tuple[int, ...]) -> dict[str, int]:
        """For each endpoint holding the first block: how many leading blocks
        it holds (matching stops at the first block it misses)."""
        holders = self._holders
        first = holders.get(hashes[0]) if hashes else None
        if not first:
            return {}
        matched: dict[str, int] = {}
        # (group, lo, hi): every endpoint of group holds block lo, none beyond hi.
        pending = [(first, 0, len(hashes) - 1)]
        while pending:
            group, lo, hi = pending.pop()
            if lo == hi:
                for endpoint in group:
                    matched[endpoint] = lo + 1
                continue
            middle = (lo + hi + 1) // 2
            holding = holders.get(hashes[middle])
            deeper = group & holding if holding else None
            if deeper:
                pending.append((deeper, middle, hi))
                if len(deeper) == len(group):
                    continue
                group = group - deeper
            pending.append((group, lo, middle - 1))
        return matched

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything recorded for `endpoint`."""
        lru = self._lrus.pop(endpoint, None)
        if lru is not None:
            for block in lru:
                self._forget(endpoint, block)

    def endpoints(self) -> set[str]:
        return set(self._lrus)

    def size(self, endpoint: str) -> int:
        lru = self._lrus.get(endpoint)
        return len(lru) if lru is not None else 0

    def _forget(self, endpoint: str, block: int) -> None:
        holder_set = self._holders[block]
        holder_set.discard(endpoint)
        if not holder_set:
            del self._holders[block]
