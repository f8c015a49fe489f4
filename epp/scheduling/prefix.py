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

`PrefixIndex` remembers, per endpoint, the blocks of the prompts it was
sent, in two generations of at most capacity // 2 blocks each: all of a
prompt's blocks are stored in the young generation; when they would
overflow it, the old generation is forgotten at once and the young one
becomes the old. So an endpoint holds the blocks of its latest prompts,
between about capacity / 2 and `capacity` of them (the reference EPP keeps
an exact LRU of `capacity`), at the cost of one dict insertion per block and
no per-block eviction.

Recording a prompt stores every one of its blocks, so an endpoint's block i
of a chain is never older than its block i+1: an endpoint holding block i
holds every block before it, and the blocks it holds of a chain are a
leading run. Its match length (blocks matched up to its first miss) is thus
found by binary search. The endpoints that hold a chain's first block are
the only ones with a match; they are searched together, split at each probe
into those holding the probed block and the rest, so matching costs
O(log blocks) membership tests per holder and nothing for endpoints without
the prefix.

The answer for the latest chain matched is kept and given again while the
same chain is asked for (the requests of one prompt match one after
another) and no holder's match can have changed: recording that chain on
an endpoint that held all of it changes nothing; any other record or a
holder's removal drops the answer (one handed out is never modified), so
an index whose prompts all differ (the simulator's) pays a comparison per
record, not a second search.

A caller that knows part of a prompt is its own (the simulator, whose
synthetic blocks after a tenant's shared prefix are unique to the request)
says from which block on (`record`'s `own_from`). No other prompt can match
those blocks, so storing them would only fill the generation: they are
counted toward it instead (`young_own`), which rotates the generations
exactly when storing them would have, and matches none the same
(`bench.instructions`: a 16-block insert is about 12,000 instructions).

Blocks are kept as the keys of dicts (values None) rather than in sets: a
dict holding only ints is not tracked by the garbage collector, whereas a
set always is. With sets, every full collection walked each of the pool's
hundreds of thousands of blocks, touching every int object. Inserting into
a dict one block at a time costs more than set.update, but less than
dict.update(dict.fromkeys(...)) or map(setdefault) (`bench.simulator`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xxhash import xxh64_intdigest


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


class Generations:
    """The blocks one endpoint holds, young and old, and of each generation
    the blocks recorded as a chain's first block, all as dict keys; and of
    each generation the count of prompts' own blocks, held but not stored."""

    __slots__ = (
        "old",
        "old_own",
        "old_own_last",
        "old_roots",
        "own_last",
        "young",
        "young_again",
        "young_own",
        "young_roots",
    )

    def __init__(self) -> None:
        self.young: dict[int, None] = {}
        self.old: dict[int, None] = {}
        self.young_roots: dict[int, None] = {}
        self.old_roots: dict[int, None] = {}
        self.young_own = 0
        self.old_own = 0
        self.own_last: Sequence[int] | None = None
        """The prompt whose own blocks the young generation counted last:
        recorded again, they are there already (as stored blocks would be)."""
        self.old_own_last: Sequence[int] | None = None
        """The same of the old generation: recorded again, they are in both."""
        self.young_again = 0
        """Own blocks the young generation counts that the old one does too."""

    def __contains__(self, block: int) -> bool:
        return block in self.young or block in self.old

    def __len__(self) -> int:
        own = self.young_own + self.old_own - self.young_again
        return len(self.young.keys() | self.old.keys()) + own

    def roots(self) -> set[int]:
        return self.young_roots.keys() | self.old_roots.keys()


class PrefixIndex:
    """Per-endpoint generations of block hashes, and the holders of each
    chain's first block (see the module docstring): an endpoint is among the
    holders of a first block exactly while one of its generations records it
    as one, so the holders also answer whether it is new to the endpoint.
    Holder sets are immutable; an endpoint's set of itself alone is shared
    by every first block only it holds."""

    __slots__ = ("_alone", "_chain", "_generation", "_held", "_matched", "_roots", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"prefix LRU capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._generation = max(1, capacity // 2)
        self._held: dict[str, Generations] = {}
        self._roots: dict[int, frozenset[str]] = {}
        self._alone: dict[str, frozenset[str]] = {}
        self._chain: tuple[int, ...] = ()
        """The latest chain matched (none yet: empty)."""
        self._matched: dict[str, int] = {}
        """`matches(_chain)` as the index is now: never modified once handed out."""

    def record(
        self,
        endpoint: str,
        hashes: Sequence[int],
        capacity: int | None = None,
        own_from: int | None = None,
    ) -> None:
        """`endpoint` was sent a prompt with these chained block hashes (in
        prompt order); `capacity`, when given, is the endpoint's own (its KV
        cache's blocks) instead of the index's; `own_from`, when given, the
        position from which the blocks are the prompt's own (counted, not
        stored: see the module docstring)."""
        held = self._held.get(endpoint)
        if held is None:
            held = self._held[endpoint] = Generations()
            self._alone[endpoint] = frozenset((endpoint,))
        if not hashes:
            return
        generation = self._generation
        if capacity is not None:  # not max(): it parses keywords per call (bench.instructions)
            generation = capacity // 2
            if generation < 1:
                generation = 1
        young_size = len(held.young) + held.young_own
        turned = young_size + len(hashes) > generation and young_size
        if turned:
            self._forget_old(endpoint, held)
        if own_from is not None:
            if hashes is not held.own_last:
                # A prompt is recorded again only at once (each profile that
                # placed it on this endpoint), so only the last can repeat.
                own = len(hashes) - own_from
                held.young_own += own
                held.own_last = hashes
                if hashes is held.old_own_last:
                    held.young_again = own
            if not own_from:  # no other prompt begins with its first block either
                if turned:
                    self._chain = ()
                return
            self._chain = ()
            hashes = hashes[:own_from]
        young = held.young
        root = hashes[0]
        holders = self._roots.get(root)
        if holders is None:
            self._roots[root] = self._alone[endpoint]
        elif endpoint not in holders:
            self._roots[root] = holders | self._alone[endpoint]
        for block in hashes:  # faster than update(dict.fromkeys(hashes))
            young[block] = None
        held.young_roots[root] = None
        chain = self._chain
        if chain and not (
            (hashes is chain or hashes == chain) and self._matched.get(endpoint) == len(chain)
        ):
            # The endpoint's match may have changed: asked again, the chain
            # is matched afresh. Recording the chain matched last on an
            # endpoint that held all of it changes nothing.
            self._chain = ()

    def matches(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each endpoint holding the first block: how many leading blocks
        it holds (matching stops at the first block it misses). The caller
        must not modify the answer: the latest chain's is kept."""
        if hashes == self._chain and hashes:
            return self._matched
        first = self._roots.get(hashes[0]) if hashes else None
        if not first:
            # Nothing to keep (asked again, it is this one lookup), and the
            # kept chain's answer stays: a chain of the simulator's own
            # blocks is never asked again, and copying it costs.
            return {}
        matched = self._match(hashes, first)
        self._chain = tuple(hashes)  # the same tuple when given one
        self._matched = matched
        return matched

    def _match(self, hashes: Sequence[int], first: frozenset[str]) -> dict[str, int]:
        """`matches` worked out, given the holders of the first block."""
        held = self._held
        matched: dict[str, int] = {}
        # (group, lo, hi): every endpoint of group holds block lo, none beyond hi.
        # An entry is (endpoint, young, old).
        pending = [([(e, held[e].young, held[e].old) for e in first], 0, len(hashes) - 1)]
        while pending:
            group, lo, hi = pending.pop()
            while lo < hi:
                middle = (lo + hi + 1) // 2
                block = hashes[middle]
                deeper = [entry for entry in group if block in entry[1] or block in entry[2]]
                if not deeper:
                    hi = middle - 1
                    continue
                if len(deeper) < len(group):
                    shallower = [
                        entry for entry in group if block not in entry[1] and block not in entry[2]
                    ]
                    pending.append((shallower, lo, middle - 1))
                    group = deeper
                lo = middle
            for entry in group:
                matched[entry[0]] = lo + 1
        return matched

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything recorded for `endpoint`."""
        held = self._held.pop(endpoint, None)
        if held is not None:
            self._drop_roots(endpoint, held.roots())
            del self._alone[endpoint]
            if endpoint in self._matched:
                self._chain = ()

    def endpoints(self) -> set[str]:
        return set(self._held)

    def entries(self) -> int:
        """Blocks held, over every endpoint."""
        return sum(len(held) for held in self._held.values())

    def size(self, endpoint: str) -> int:
        """How many blocks `endpoint` holds."""
        held = self._held.get(endpoint)
        return len(held) if held is not None else 0

    def _forget_old(self, endpoint: str, held: Generations) -> None:
        """Forget the old generation; the young one becomes the old."""
        self._drop_roots(endpoint, held.old_roots.keys() - held.young_roots.keys())
        held.old = held.young
        held.old_roots = held.young_roots
        held.old_own = held.young_own
        held.young = {}
        held.young_roots = {}
        held.young_own = 0
        held.old_own_last = held.own_last
        held.own_last = None
        held.young_again = 0

    def _drop_roots(self, endpoint: str, roots: Iterable[int]) -> None:
        """`endpoint` no longer holds these first blocks."""
        alone = self._alone[endpoint]
        holders_of = self._roots
        for root in roots:
            holders = holders_of[root]
            if holders is alone:
                del holders_of[root]
            elif holders := holders - alone:
                holders_of[root] = holders
            else:
                del holders_of[root]
