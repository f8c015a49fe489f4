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
(bounded by `capacity`), and a reverse map hash -> endpoints, so matching a
prompt against every endpoint costs one set intersection per matched block,
not one lookup per endpoint and block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from xxhash import xxh64_intdigest


def block_hashes(prompt: str, model: str, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of `prompt`, seeded with `model`."""
    count = min(len(prompt) // block_chars, max_blocks)
    previous = xxh64_intdigest(model.encode())
    hashes = []
    for start in range(0, count * block_chars, block_chars):
        previous = xxh64_intdigest(
            prompt[start : start + block_chars].encode() + previous.to_bytes(8, "little")
        )
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

    def record(self, endpoint: str, hashes: Iterable[int]) -> None:
        """`endpoint` was sent a prompt with these block hashes."""
        lru = self._lrus.get(endpoint)
        if lru is None:
            lru = self._lrus[endpoint] = OrderedDict()
        holders = self._holders
        for block in hashes:
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
        if not hashes or hashes[0] not in holders:
            return {}
        alive = set(holders[hashes[0]])
        matched: dict[str, int] = {}
        for depth in range(1, len(hashes)):
            holding = holders.get(hashes[depth])
            survivors = alive & holding if holding else set()
            if len(survivors) != len(alive):
                for endpoint in alive - survivors:
                    matched[endpoint] = depth
                if not survivors:
                    return matched
                alive = survivors
        for endpoint in alive:
            matched[endpoint] = len(hashes)
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
