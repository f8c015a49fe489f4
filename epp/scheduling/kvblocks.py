"""The precise prefix cache: vLLM's own block keys, and which endpoint holds
which according to the endpoints' KV-cache events.

Block keys (`BlockHasher`) are computed as vLLM computes them
(`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`, and
`vllm/utils/hashing.py`): tokens are cut into full blocks of `block_size`;

    NONE_HASH = H(hash_seed)                  (vLLM: H(os.environ["PYTHONHASHSEED"]))
    h_i       = H((h_i-1 or NONE_HASH, tuple(block_i tokens), extra_keys_i))

where H serializes its argument (pickle at the highest protocol, canonical
CBOR, or MessagePack) and digests it (SHA-256, or xxh3-128), and
`extra_keys_i` is None or a tuple: the LoRA adapter's name on every block,
then the cache salt on block 0. The hashes chain over their full digests; the
key an event carries, and the one this index stores, is the digest's last 8
bytes as a big-endian integer (`maybe_convert_block_hash`, vLLM's default
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`). So a lookup matches what the
server reports exactly when `block_size`, `hash_seed` and the algorithm are
the server's (`--block-size`, `PYTHONHASHSEED`, `--prefix-caching-hash-algo`).

`KVBlockIndex` maps each key to the endpoints that reported storing it and
each endpoint to its keys, applied event by event (`apply`): BlockStored
adds, BlockRemoved removes (per storage medium: a block offloaded to CPU and
still on GPU stays), AllBlocksCleared drops the endpoint's keys. It holds at
most `size` keys; past that the least recently stored key is evicted, from
every endpoint (the reference's in-memory index: an LRU of keys, each with
at most `pods_per_key` endpoints). An endpoint that leaves the pool takes its
keys with it (`remove_endpoint`). An endpoint that publishes nothing holds
nothing, so it matches nothing.

A restart (AllBlocksCleared, or the shell's subscriber seeing a new
process: `clear_endpoint`) empties the endpoint, but what it held is kept as
its former keys until it evicts again (its first BlockRemoved: it is full
once more) or restarts again; they count against `size`, the oldest
restart's dropped first. `former_home` finds the endpoint whose former keys
hold a longer leading run of a prompt than any endpoint holds now: a
session whose history was on the restarted server alone. The precise scorer
sends it back there (scored as deep as it was held; the metrics still say
nothing is cached there): that server is as good as any for the part no
server holds, and idle, while sending its sessions to the servers holding
their shared system prompt piles them there and leaves it empty
(`bench/README.md`, `precise-chat-restarts`).

With speculation on, `record` marks the blocks of a prompt just sent to an
endpoint as held there for `speculative_ttl` seconds (the reference's
`speculativeIndexing`), covering the time until the server's event arrives;
a stored event for the same key makes it confirmed, so the guess's expiry
leaves it.

Matching walks the prompt's keys in order; an endpoint's match is its
leading run of held keys (it stops at its first miss, as vLLM's own prefix
lookup does), so it costs one dict lookup per key plus one membership test
per endpoint still matching.
"""

from __future__ import annotations

import enum
import hashlib
import pickle
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import msgspec
import xxhash

KEY_MASK = (1 << 64) - 1

_MSGPACK = msgspec.msgpack.Encoder()


class HashAlgorithm(enum.Enum):
    """vLLM's `--prefix-caching-hash-algo` values."""

    SHA256 = "sha256"
    SHA256_CBOR = "sha256_cbor"
    SHA256_MSGPACK = "sha256_msgpack"
    XXHASH = "xxhash"
    XXHASH_CBOR = "xxhash_cbor"
    XXHASH_MSGPACK = "xxhash_msgpack"


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


_SERIALIZE: dict[HashAlgorithm, Callable[[Any], bytes]] = {
    HashAlgorithm.SHA256: _pickled,
    HashAlgorithm.SHA256_CBOR: _cbor,
    HashAlgorithm.SHA256_MSGPACK: _MSGPACK.encode,
    HashAlgorithm.XXHASH: _pickled,
    HashAlgorithm.XXHASH_CBOR: _cbor,
    HashAlgorithm.XXHASH_MSGPACK: _MSGPACK.encode,
}


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


_DIGEST: dict[HashAlgorithm, Callable[[bytes], bytes]] = {
    algorithm: (_sha256 if algorithm.value.startswith("sha256") else xxhash.xxh3_128_digest)
    for algorithm in HashAlgorithm
}


def vllm_hash(algorithm: HashAlgorithm, value: Any) -> bytes:
    """vLLM's hash function `algorithm` of `value` (`get_hash_fn_by_name`)."""
    return _DIGEST[algorithm](_SERIALIZE[algorithm](value))


def external_key(digest: bytes) -> int:
    """The 64-bit key an event carries for a block's digest."""
    return int.from_bytes(digest, "big") & KEY_MASK


class DigestMemo:
    """Block digests computed before, by (parent digest, block tokens, extra
    keys): a prompt that repeats one hashed before (a shared system prompt,
    a conversation's earlier turns) costs a dict lookup a block instead of
    a serialization and a digest (about 8x less). The key is the digest's
    whole input, so a hit is exact under any hash seed or algorithm. At most
    `capacity` entries (about 800 bytes each, `--digest-memo-entries`); past
    it the memo starts over (the prompts that repeat fill it again within a
    few requests), counting what it let go in `dropped`."""

    __slots__ = ("_digests", "capacity", "dropped")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.dropped = 0
        """Digests let go when the memo started over, since the start."""
        self._digests: dict[tuple[bytes, tuple[int, ...], Any], bytes] = {}

    def __len__(self) -> int:
        return len(self._digests)

    def get(self, key: tuple[bytes, tuple[int, ...], Any]) -> bytes | None:
        return self._digests.get(key)

    def put(self, key: tuple[bytes, tuple[int, ...], Any], digest: bytes) -> None:
        digests = self._digests
        if len(digests) >= self.capacity:
            self.dropped += len(digests)
            digests.clear()
            if not self.capacity:
                return
        digests[key] = digest


@dataclass(slots=True, frozen=True)
class BlockHasher:
    """Tokens to vLLM block keys for one server configuration."""

    block_size: int = 16
    hash_seed: str = ""
    algorithm: HashAlgorithm = HashAlgorithm.SHA256_CBOR
    none_hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block size must be positive, got {self.block_size}")
        object.__setattr__(self, "none_hash", vllm_hash(self.algorithm, self.hash_seed))

    def digests(
        self,
        tokens: Sequence[int],
        max_blocks: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        memo: DigestMemo | None = None,
    ) -> list[bytes]:
        """The full digests of the full blocks of `tokens`, in order (those
        `memo` holds taken from it, the others put in it)."""
        size = self.block_size
        count = len(tokens) // size
        if max_blocks is not None:
            count = min(count, max_blocks)
        serialize = _SERIALIZE[self.algorithm]
        digest = _DIGEST[self.algorithm]
        lora = (lora_name,) if lora_name else ()
        first = (*lora, cache_salt) if cache_salt else lora
        extra_first = first or None
        extra_rest = lora or None
        parent = self.none_hash
        out = []
        for index in range(count):
            start = index * size
            block = tuple(tokens[start : start + size])
            extra = extra_first if index == 0 else extra_rest
            if memo is None:
                parent = digest(serialize((parent, block, extra)))
            else:
                key = (parent, block, extra)
                known = memo.get(key)
                if known is None:
                    known = digest(serialize(key))
                    memo.put(key, known)
                parent = known
            out.append(parent)
        return out

    def keys(
        self,
        tokens: Sequence[int],
        max_blocks: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        memo: DigestMemo | None = None,
    ) -> tuple[int, ...]:
        """The 64-bit keys of the full blocks of `tokens` (what events carry)."""
        digests = self.digests(tokens, max_blocks, lora_name, cache_salt, memo)
        return tuple(map(external_key, digests))


# -- events (decoded by the shell from the servers' msgpack batches) ---------


@dataclass(slots=True, frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    lora_name: str | None = None
    medium: str | None = None


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(slots=True, frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared

GPU = 1
"""Medium bits of a held key: GPU (also an event without a medium), any
other medium (CPU offload, disk), and a speculative guess."""
OFFLOADED = 2
GUESSED = 4


def medium_bit(medium: str | None) -> int:
    return GPU if medium is None or medium.upper() == "GPU" else OFFLOADED


def _ignore(_: float) -> None:
    pass


@dataclass(slots=True)
class IndexCounters:
    """What the index did since it was made (the shell exports them)."""

    admissions: int = 0
    evictions: int = 0
    lookups: int = 0
    lookup_hits: int = 0
    """Blocks matched by the best endpoint, summed over lookups."""
    max_pod_hits: int = 0
    """The longest per-endpoint run observed per lookup, summed (the reference's
    `max_pod_hit_count_total`)."""
    removed_unknown: int = 0
    """Removals of keys the endpoint was not known to hold."""


class KVBlockIndex:
    """Engine block keys to the endpoints holding them (module docstring).

    Invariants: a key is in `_holders` iff some endpoint holds it with a
    non-zero medium mask; `_held[e]` has key k iff `_holders[k]` has e;
    `len(_holders) <= size`; no key has more than `pods_per_key` holders.
    `_holders` is in storing order (the oldest first), which is the
    eviction order."""

    __slots__ = (
        "_clock",
        "_former",
        "_former_keys",
        "_guesses",
        "_held",
        "_holders",
        "_lookup_clock",
        "_on_lookup",
        "counters",
        "pods_per_key",
        "size",
        "speculative_ttl",
    )

    def __init__(
        self,
        size: int = 100_000_000,
        pods_per_key: int = 10,
        speculative_ttl: float | None = None,
        clock: Callable[[], float] = lambda: 0.0,
    ) -> None:
        if size <= 0 or pods_per_key <= 0:
            raise ValueError(
                f"index size and pods per key must be positive, got {size}, {pods_per_key}"
            )
        self.size = size
        self.pods_per_key = pods_per_key
        self.speculative_ttl = speculative_ttl
        self._clock = clock
        self._holders: dict[int, dict[str, int]] = {}
        self._held: dict[str, dict[int, None]] = {}
        self._guesses: deque[tuple[float, str, tuple[int, ...]]] = deque()
        self._former: dict[str, dict[int, None]] = {}
        """What each endpoint held before it last restarted (`clear_endpoint`),
        until it next evicts a block; the oldest restart first."""
        self._former_keys = 0
        """Keys in `_former`, over every endpoint: they count against `size`."""
        self.counters = IndexCounters()
        self._lookup_clock: Callable[[], float] | None = None
        self._on_lookup: Callable[[float], None] = _ignore

    # -- size ----------------------------------------------------------------

    def __len__(self) -> int:
        """Keys held by some endpoint."""
        return len(self._holders)

    def entries(self) -> int:
        """(key, endpoint) pairs held."""
        return sum(len(keys) for keys in self._held.values())

    def endpoints(self) -> set[str]:
        return set(self._held)

    def former_keys(self) -> int:
        """Keys kept of what restarted endpoints held before (`former_home`)."""
        return self._former_keys

    def held_by(self, endpoint: str) -> int:
        """How many keys `endpoint` holds."""
        return len(self._held.get(endpoint, ()))

    def holds(self, endpoint: str, key: int) -> bool:
        return key in self._held.get(endpoint, ())

    # -- events --------------------------------------------------------------

    def apply(self, endpoint: str, events: Iterable[KVEvent]) -> None:
        """`endpoint`'s events, in the order it published them."""
        for event in events:
            if isinstance(event, BlockStored):
                self.store(endpoint, event.block_hashes, medium_bit(event.medium))
            elif isinstance(event, BlockRemoved):
                self.remove(endpoint, event.block_hashes, medium_bit(event.medium))
            else:
                self.clear_endpoint(endpoint)

    def store(self, endpoint: str, keys: Iterable[int], bit: int = GPU) -> None:
        holders_of = self._holders
        held = self._held.get(endpoint)
        if held is None:
            held = self._held[endpoint] = {}
        for key in keys:
            holders = holders_of.pop(key, None)
            if holders is None:
                holders = {}
                self.counters.admissions += 1
            holders_of[key] = holders  # now the most recently stored
            mask = holders.pop(endpoint, 0)
            holders[endpoint] = mask | bit
            if not mask:
                held[key] = None
                if len(holders) > self.pods_per_key:
                    oldest = next(iter(holders))
                    del holders[oldest]
                    del self._held[oldest][key]
        self.trim()

    def trim(self) -> None:
        """Past `size` keys (the former ones counted), drop the oldest
        restart's former keys, then evict the least recently stored keys."""
        while len(self._holders) + self._former_keys > self.size:
            if self._former:
                self._drop_former(next(iter(self._former)))
            else:
                self._evict_oldest()

    def remove(self, endpoint: str, keys: Iterable[int], bit: int = GPU) -> None:
        if endpoint in self._former:
            # It evicts: it is full again, and what it held before its
            # restart no longer says where a session is best sent.
            self._drop_former(endpoint)
        self._clear(endpoint, keys, bit, True)

    def _clear(self, endpoint: str, keys: Iterable[int], bit: int, count: bool) -> None:
        """`endpoint` no longer holds `keys` on medium `bit`; a key it holds
        on no real medium any more (a guess alone does not count) leaves it."""
        holders_of = self._holders
        held = self._held.get(endpoint)
        for key in keys:
            holders = holders_of.get(key)
            mask = holders.get(endpoint, 0) if holders is not None else 0
            if not mask & bit:
                if count:
                    self.counters.removed_unknown += 1
                continue
            assert holders is not None and held is not None
            mask &= ~bit
            if mask & (GPU | OFFLOADED):
                holders[endpoint] = mask
                continue
            del holders[endpoint]
            del held[key]
            if not holders:
                del holders_of[key]

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything `endpoint` holds and held (it left the pool)."""
        self._drop_former(endpoint)
        self._release(endpoint)

    def clear_endpoint(self, endpoint: str) -> None:
        """`endpoint` restarted (AllBlocksCleared, or its publisher's
        sequence started again): it holds nothing; what it held becomes its
        former keys (`former_home`)."""
        self._drop_former(endpoint)
        held = self._release(endpoint)
        self._held[endpoint] = {}
        if held:
            self._former[endpoint] = held
            self._former_keys += len(held)
            self.trim()

    def _release(self, endpoint: str) -> dict[int, None] | None:
        """`endpoint` holds nothing any more; what it held."""
        held = self._held.pop(endpoint, None)
        if not held:
            return held
        holders_of = self._holders
        for key in held:
            holders = holders_of[key]
            del holders[endpoint]
            if not holders:
                del holders_of[key]
        return held

    def _drop_former(self, endpoint: str) -> None:
        former = self._former.pop(endpoint, None)
        if former is not None:
            self._former_keys -= len(former)

    def former_home(self, keys: Sequence[int], best: int) -> tuple[str, int] | None:
        """The endpoint whose former keys (what it held before its restart)
        hold a longer leading run of `keys` than `best`, the longest any
        endpoint holds now, and that run's length (None: no such endpoint).
        A session whose history no endpoint holds now is best sent back to
        the server that lost it: that one is as good as any for the part
        nothing holds, and sessions stay spread as they were."""
        if not self._former or len(keys) <= best:
            return None
        beyond = keys[best]
        found: tuple[str, int] | None = None
        for endpoint, former in self._former.items():
            if beyond not in former:
                continue
            depth = 0
            for key in keys:
                if key not in former:
                    break
                depth += 1
            if depth > best and (found is None or depth > found[1]):
                found = (endpoint, depth)
        return found

    def _evict_oldest(self) -> None:
        key = next(iter(self._holders))
        for endpoint in self._holders.pop(key):
            del self._held[endpoint][key]
        self.counters.evictions += 1

    # -- speculation -----------------------------------------------------------

    def record(self, endpoint: str, keys: Sequence[int], capacity: int | None = None) -> None:
        """`endpoint` was just sent a prompt with these keys: with
        speculation on, they count as held there until the guess expires
        (or an event confirms them)."""
        if self.speculative_ttl is None or not keys:
            return
        now = self._clock()
        self._expire(now)
        fresh = tuple(key for key in keys if not self.holds(endpoint, key))
        if fresh:
            self.store(endpoint, fresh, GUESSED)
            self._guesses.append((now + self.speculative_ttl, endpoint, fresh))

    def _expire(self, now: float) -> None:
        guesses = self._guesses
        while guesses and guesses[0][0] <= now:
            _, endpoint, keys = guesses.popleft()
            self._clear(endpoint, keys, GUESSED, False)

    # -- lookup ------------------------------------------------------------------

    def watch_lookups(self, clock: Callable[[], float], observe: Callable[[float], None]) -> None:
        """Tell `observe` how long each lookup took on `clock` (the shell's
        lookup-latency histogram)."""
        self._lookup_clock = clock
        self._on_lookup = observe

    def matches(self, keys: Sequence[int]) -> dict[str, int]:
        """For each endpoint holding the first key: how many leading keys it
        holds (matching stops at its first miss)."""
        clock = self._lookup_clock
        if clock is None:
            return self._matches(keys)
        start = clock()
        matched = self._matches(keys)
        self._on_lookup(clock() - start)
        return matched

    def _matches(self, keys: Sequence[int]) -> dict[str, int]:
        counters = self.counters
        counters.lookups += 1
        if self._guesses:
            self._expire(self._clock())
        holders_of = self._holders
        first = holders_of.get(keys[0]) if keys else None
        if not first:
            return {}
        matched: dict[str, int] = {}
        alive = list(first)
        depth = 1
        for key in keys[1:]:
            holders = holders_of.get(key)
            if holders is None:
                break
            still = [endpoint for endpoint in alive if endpoint in holders]
            if len(still) < len(alive):
                for endpoint in alive:
                    if endpoint not in holders:
                        matched[endpoint] = depth
                alive = still
                if not alive:
                    break
            depth += 1
        for endpoint in alive:
            matched[endpoint] = depth
        best = max(matched.values())
        counters.lookup_hits += best
        counters.max_pod_hits += best
        return matched


@dataclass(slots=True, frozen=True)
class PreciseConfig:
    """The `precise-prefix-cache-producer` as the core needs it: its name
    (what `prefix-cache-scorer`'s `prefixMatchInfoProducerName` names), the
    servers' block hashing, at most `max_blocks` keys hashed per prompt, and
    the index's bounds (`indexerConfig.kvBlockIndexConfig.inMemoryConfig`:
    `size` keys, `podCacheSize` endpoints per key) and speculation
    (`speculativeIndexing`, `speculativeTTL`; None when off)."""

    name: str = "precise-prefix-cache-producer"
    hasher: BlockHasher = field(default_factory=BlockHasher)
    max_blocks: int = 8192
    index_size: int = 100_000_000
    pods_per_key: int = 10
    speculative_ttl: float | None = None

    def keys_of(
        self, tokens: Sequence[int], cache_salt: str | None = None, memo: DigestMemo | None = None
    ) -> tuple[int, ...]:
        """The block keys a prompt of `tokens` is looked up by."""
        return self.hasher.keys(tokens, self.max_blocks, None, cache_salt, memo) if tokens else ()

    def index(self, clock: Callable[[], float]) -> KVBlockIndex:
        return KVBlockIndex(self.index_size, self.pods_per_key, self.speculative_ttl, clock)

    def retune(self, index: KVBlockIndex) -> None:
        """`index` (kept across a reload) bounded as this configuration says."""
        index.size = self.index_size
        index.pods_per_key = self.pods_per_key
        index.speculative_ttl = self.speculative_ttl
        index.trim()
