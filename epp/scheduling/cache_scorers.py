"""The scorers that read a prefix index: the prefix-cache scorer, which
keeps the approximate index (`epp.scheduling.prefix`, one per scheduler,
shared by every scorer that reads it), its precise twin over the servers'
reported blocks (`epp.scheduling.kvblocks`), the no-hit LRU scorer (spreads
requests no endpoint has cached) and the token-load scorer (tokens in
flight plus the prompt less what is cached). The other scorers are in
`scorers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from types import MappingProxyType

from epp.scheduling.endpoint import Endpoint, PoolSnapshot
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.kvblocks import KVBlockIndex, PreciseConfig
from epp.scheduling.prefix import PrefixIndex, block_hashes
from epp.scheduling.request import InferenceRequest, PrefixMatch
from epp.scheduling.scorers import PerCandidates, StatelessScorer
from epp.scheduling.spec import BuildContext

NO_SCORES: Mapping[str, float] = MappingProxyType({})
NO_MATCHES: Mapping[str, int] = MappingProxyType({})


CHARS_PER_TOKEN = 4
"""Characters per token where a token count is estimated from text, as the
reference's approximate prefix cache does."""


MIN_BLOCK_TOKENS = 64
"""The smallest auto-tuned block, in tokens: the reference's floor, which
bounds the index (one entry per endpoint and block; vLLM's 16-token blocks
would make it four times larger)."""


def tuned_geometry(
    pool: PoolSnapshot, block_chars: int, max_blocks: int, max_tokens: int
) -> tuple[int, int]:
    """(block characters, blocks per prompt) auto-tuned from the block size
    the pool's first endpoint reporting one reports (at least
    MIN_BLOCK_TOKENS; blocks per prompt = `max_tokens` over it when set);
    the configured ones when none reports one."""
    for endpoint in pool.endpoints:
        size = endpoint.metrics.block_size
        if size is not None and size > 0:
            tokens = max(MIN_BLOCK_TOKENS, size)
            blocks = max_tokens // tokens if max_tokens > 0 else max_blocks
            return tokens * CHARS_PER_TOKEN, max(blocks, 1)
    return block_chars, max_blocks


APPROX_PRODUCER = "approx-prefix-cache-producer"
PRECISE_PRODUCER = "precise-prefix-cache-producer"
"""The producer types of the approximate and the precise prefix index."""


class PrefixCacheScorer:
    """Matched leading prompt blocks / all prompt blocks (see `prefix`).

    A prompt shorter than one block scores 0 everywhere. The prompt's hashes
    are cached on the request, so placing it again does not rehash it.

    Auto-tuned (the producer's `autoTune`, given `pool`): the block size is
    the one the endpoints report (`tuned_geometry`, read again when the
    snapshot changes), and an endpoint that reports its KV cache's block
    count keeps that many blocks in the index instead of `lru_capacity`, as
    the reference's producer does.
    """

    __slots__ = (
        "_addresses",
        "_index",
        "_last",
        "_pool",
        "_scored",
        "_tuned",
        "_tuned_version",
        "block_chars",
        "match_length_scale_tokens",
        "match_length_weight",
        "max_blocks",
        "max_tokens",
        "producer",
    )

    def __init__(
        self,
        block_chars: int,
        max_blocks: int,
        lru_capacity: int,
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = 8192,
        pool: Callable[[], PoolSnapshot] | None = None,
        max_tokens: int = 0,
        producer: tuple[str, str] = (APPROX_PRODUCER, APPROX_PRODUCER),
    ) -> None:
        if block_chars <= 0 or max_blocks <= 0:
            raise ValueError(
                f"prefix blocks need positive size and count, got {block_chars} x {max_blocks}"
            )
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.match_length_weight = match_length_weight
        self.match_length_scale_tokens = match_length_scale_tokens
        self._index = PrefixIndex(lru_capacity)
        self._addresses = PerCandidates(attrgetter("address"))
        self._pool = pool
        self.max_tokens = max_tokens
        self._tuned = (block_chars, max_blocks)
        self._tuned_version: int | None = None
        self.producer = producer
        """(name, type) of the producer whose index this is (the prefix metrics' labels)."""
        self._last: tuple[InferenceRequest | None, Mapping[str, int], Sequence[int]] = (
            None,
            NO_MATCHES,
            (),
        )
        """The latest request scored, its matches and its hashes, for `picked`."""
        self._scored: tuple[Mapping[str, int], float, float, float, Mapping[str, float]] = (
            NO_MATCHES,
            0.0,
            0.0,
            0.0,
            NO_SCORES,
        )
        """The latest scores made: (from these matches, with this scale,
        match-length weight and term per block, the scores). The index gives the same
        matches again while they hold, so these scores hold too."""

    def geometry(self) -> tuple[int, int]:
        """(block characters, blocks per prompt) now."""
        pool = self._pool
        if pool is None:
            return self.block_chars, self.max_blocks
        snapshot = pool()
        if snapshot.version != self._tuned_version:
            self._tuned_version = snapshot.version
            self._tuned = tuned_geometry(
                snapshot, self.block_chars, self.max_blocks, self.max_tokens
            )
        return self._tuned

    def hashes(self, request: InferenceRequest) -> Sequence[int]:
        block_chars, max_blocks = self.geometry() if self._pool is not None else self._tuned
        cached = request.prefix_hashes
        if cached is not None and cached[0] == block_chars and cached[1] == max_blocks:
            return cached[2]
        hashes = block_hashes(request.prompt, request.target_model, block_chars, max_blocks)
        request.prefix_hashes = (block_chars, max_blocks, hashes)
        request.prefix_own_from = None  # it was of the hashes replaced
        return hashes

    def block_chars_of(self, request: InferenceRequest) -> int:
        """The block size `request` was hashed with."""
        cached = request.prefix_hashes
        return cached[0] if cached is not None else self.block_chars

    def sparse_scores(self, request: InferenceRequest) -> Mapping[str, float]:
        """The caller must not modify the scores: the latest are given again."""
        hashes = self.hashes(request)
        matched = self._index.matches(hashes) if hashes else None
        self._last = (request, matched or NO_MATCHES, hashes)
        if not matched:
            return NO_SCORES
        return self.scored(request, hashes, matched)

    def scored(
        self, request: InferenceRequest, hashes: Sequence[int], matched: Mapping[str, int]
    ) -> dict[str, float]:
        """The scores of endpoints holding `matched` leading blocks of the prompt."""
        scale = 1.0 / self.prompt_blocks(request, hashes)
        weight = self.match_length_weight
        per_block = 0.0
        if weight != 0.0:
            per_block = (
                self.block_chars_of(request) / CHARS_PER_TOKEN / self.match_length_scale_tokens
            )
        scored = self._scored
        if (
            matched is scored[0]
            and scale == scored[1]
            and weight == scored[2]
            and per_block == scored[3]
        ):
            return scored[4]
        if weight == 0.0:
            scores = {address: count * scale for address, count in matched.items()}
        else:
            # The reference's match-length term: (matched tokens / scale tokens)^2, capped at 1.
            scores = {
                address: weight * min(1.0, count * per_block) ** 2 + (1.0 - weight) * count * scale
                for address, count in matched.items()
            }
        self._scored = (matched, scale, weight, per_block, scores)
        return scores

    def prompt_blocks(self, request: InferenceRequest, hashes: Sequence[int]) -> int:
        """The blocks of the prompt a score is the share of."""
        return len(hashes)

    def index_entries(self) -> int:
        """Blocks the index holds, over every endpoint."""
        return self._index.entries()

    def share_index(self, other: PrefixCacheScorer) -> None:
        """Read and record into `other`'s index from now on."""
        self._index = other._index

    def matched_blocks(self, request: InferenceRequest, address: str) -> int:
        """How many leading blocks of the prompt `address` holds."""
        return self.matches(request).get(address, 0)

    def matches(self, request: InferenceRequest) -> Mapping[str, int]:
        """Leading blocks of the prompt held, by endpoint address (only
        endpoints that hold some)."""
        hashes = self.hashes(request)
        return (self._index.matches(hashes) if hashes else None) or NO_MATCHES

    def cached_tokens(self, request: InferenceRequest) -> Mapping[str, float]:
        """Tokens of the prompt cached, by endpoint address (4 characters a token)."""
        matches = self.matches(request)
        per_block = self.block_chars_of(request) / CHARS_PER_TOKEN
        return {address: count * per_block for address, count in matches.items()}

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        scores = self.sparse_scores(request)
        if not scores:
            return [0.0] * len(endpoints)
        return list(map(scores.get, self._addresses.of(endpoints), repeat(0.0)))

    def note_match(
        self, request: InferenceRequest, endpoint: Endpoint, hashes: Sequence[int]
    ) -> None:
        """Tell `request`, whose prompt's blocks are `hashes`, what this index
        predicts for `endpoint` (unless an earlier scorer told it: the first
        profile's placement is the one the metrics report)."""
        if request.prefix_match is not None:
            return
        scored, matches, _ = self._last
        matched = (matches if scored is request else self.matches(request)).get(endpoint.address, 0)
        tokens = request.token_ids
        request.prefix_match = PrefixMatch(
            *self.producer,
            matched,
            len(hashes),
            self.block_chars_of(request) // CHARS_PER_TOKEN,
            # the whole prompt's count: its tokens may be only its leading part
            request.input_tokens or (len(tokens) if tokens else 0),
        )

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        # A request is scored in the choice that places it, on the same
        # snapshot: the hashes of that scoring are its own (bench.instructions).
        scored = self._last
        hashes = scored[2] if scored[0] is request else self.hashes(request)
        if request.prefix_match is None:  # note_match's own test, a call spared
            self.note_match(request, endpoint, hashes)
        capacity = None
        if self._pool is not None:
            blocks = endpoint.metrics.num_gpu_blocks
            capacity = blocks if blocks is not None and blocks > 0 else None
        self._index.record(endpoint.address, hashes, capacity, request.prefix_own_from)

    def forget(self, address: str) -> None:
        self._index.remove_endpoint(address)


class PrecisePrefixCacheScorer(PrefixCacheScorer):
    """The prefix-cache scorer over the precise index (`kvblocks`): the
    prompt's tokens hashed into the servers' own block keys, matched against
    the blocks the servers reported holding. Scores, match lengths and
    cached tokens mean what they mean for the approximate index; a request
    without tokens matches nothing. A pick is recorded only as a
    speculative guess (when speculation is on); the events are the truth."""

    __slots__ = ("_config",)

    def __init__(
        self,
        index: KVBlockIndex,
        config: PreciseConfig,
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = 8192,
    ) -> None:
        size = config.hasher.block_size
        super().__init__(
            size * CHARS_PER_TOKEN,
            config.max_blocks,
            1,
            match_length_weight,
            match_length_scale_tokens,
            producer=(config.name, PRECISE_PRODUCER),
        )
        self._index = index  # type: ignore[assignment]
        self._config = config

    def hashes(self, request: InferenceRequest) -> Sequence[int]:
        keys = request.kv_block_keys
        if keys is None:
            keys = request.kv_block_keys = self._config.keys_of(
                request.token_ids or (), request.cache_salt
            )
        return keys

    def block_chars_of(self, request: InferenceRequest) -> int:
        return self.block_chars

    def prompt_blocks(self, request: InferenceRequest, hashes: Sequence[int]) -> int:
        # The tokens may be the prompt's leading part (the token producer's
        # prefix store), input_tokens its whole: a score is the share of
        # the whole prompt cached, as with every token keyed.
        whole = min(self.max_blocks, request.input_tokens // self._config.hasher.block_size)
        return max(len(hashes), whole)

    def sparse_scores(self, request: InferenceRequest) -> Mapping[str, float]:
        scores = super().sparse_scores(request)
        index: KVBlockIndex = self._index  # type: ignore[assignment]
        if not index.former_keys():
            return scores
        _, matched, hashes = self._last
        home = index.former_home(hashes, max(matched.values(), default=0))
        if home is None:
            return scores
        # A session no server holds now goes back to the server that held it
        # before it restarted, scored as deep as it held it (the metrics and
        # the cached tokens stay what the servers hold).
        return self.scored(request, hashes, {**matched, home[0]: home[1]})

    def share_index(self, other: PrefixCacheScorer) -> None:
        """The precise index is the core's, already shared."""

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        hashes = self.hashes(request)
        self.note_match(request, endpoint, hashes)
        self._index.record(endpoint.address, hashes)

    def forget(self, address: str) -> None:
        self._index.remove_endpoint(address)


class TokenLoadScorer(StatelessScorer):
    """Fewer prompt tokens in flight is better (the reference's
    token-load-scorer): an endpoint's tokens are those in flight there plus
    this request's own prompt less what is cached there; 1 - tokens /
    `threshold`, 0 from the threshold on, 1 with none."""

    __slots__ = ("_context", "_load", "threshold")

    def __init__(
        self, load: InFlightLoad, threshold: float, context: BuildContext | None = None
    ) -> None:
        self._load = load
        self.threshold = float(threshold)
        self._context = context
        """Where the prefix index is found (built before or after this scorer)."""

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        context = self._context
        prefix = context.first(PrefixCacheScorer) if context is not None else None
        cached = prefix.cached_tokens(request) if prefix is not None else NO_SCORES
        own = request.input_tokens
        threshold = self.threshold
        tokens_at = self._load.tokens_at
        scores = []
        for endpoint in endpoints:
            address = endpoint.address
            tokens = tokens_at(address) + max(0.0, own - cached.get(address, 0.0))
            scores.append(1.0 if tokens <= 0 else 1.0 - min(tokens, threshold) / threshold)
        return scores


class NoHitLruScorer:
    """On a request no endpoint has a cached prefix of (a cold request),
    spreads the cold requests: endpoints never sent one score highest, then
    the least recently sent one; on a warm request every endpoint scores
    0.5. Remembers at most `size` endpoints."""

    __slots__ = ("_prefix", "_recent", "_warm", "size")

    def __init__(self, prefix: PrefixCacheScorer | None, size: int = 1024) -> None:
        self._prefix = prefix
        self._recent: dict[str, None] = {}
        """Endpoints sent a cold request, least recent first."""
        self._warm = False
        self.size = size

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        prefix = self._prefix
        self._warm = prefix is not None and bool(prefix.sparse_scores(request))
        count = len(endpoints)
        if self._warm:
            return [0.5] * count
        if count == 1:
            return [1.0]
        recent = self._recent
        never = [endpoint for endpoint in endpoints if endpoint.address not in recent]
        rank = {endpoint.address: index for index, endpoint in enumerate(never)}
        used = [address for address in recent if address not in rank]
        for position, address in enumerate(used):
            rank[address] = len(never) + position
        scale = 1.0 / (count - 1)
        return [max(0.0, 1.0 - rank.get(endpoint.address, 0) * scale) for endpoint in endpoints]

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        if self._warm:
            return
        recent = self._recent
        recent.pop(endpoint.address, None)
        recent[endpoint.address] = None
        if len(recent) > self.size:
            del recent[next(iter(recent))]

    def forget(self, address: str) -> None:
        self._recent.pop(address, None)


# -- factories (the registry's plugin types build through these) --


def prefix_cache_scorer(
    context: BuildContext,
    match_length_weight: float = 0.0,
    match_length_scale_tokens: int = 8192,
    producer: str = "",
) -> PrefixCacheScorer:
    """One prefix index per scheduler: every prefix-cache scorer of the
    configuration reads the same one (the reference's producer). A scorer
    whose `producer` is the configured precise-prefix-cache-producer reads
    the precise index instead (the core's, fed by the servers' events)."""
    config = context.config
    precise = config.precise
    if producer and precise is not None and producer == precise.name:
        if context.kv_index is None:
            context.kv_index = precise.index(context.clock)
        return PrecisePrefixCacheScorer(
            context.kv_index, precise, match_length_weight, match_length_scale_tokens
        )
    existing = next(
        (
            p
            for p in context.built.values()
            if isinstance(p, PrefixCacheScorer) and not isinstance(p, PrecisePrefixCacheScorer)
        ),
        None,
    )
    scorer = PrefixCacheScorer(
        config.prefix_block_chars,
        config.prefix_max_blocks,
        config.prefix_lru_capacity,
        match_length_weight,
        match_length_scale_tokens,
        context.pool if config.prefix_auto_tune else None,
        config.prefix_max_tokens,
        (config.prefix_producer, APPROX_PRODUCER),
    )
    if existing is not None:
        scorer.share_index(existing)
    return scorer


def token_load_scorer(context: BuildContext, threshold: int = 4_194_304) -> TokenLoadScorer:
    return TokenLoadScorer(context.in_flight_load(), threshold, context)


def no_hit_lru_scorer(context: BuildContext, size: int = 1024) -> NoHitLruScorer:
    return NoHitLruScorer(context.first(PrefixCacheScorer), size)
