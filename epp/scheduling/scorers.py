"""Scorers: each rates every candidate endpoint in [0, 1], higher is better.

The scheduler multiplies each score by its scorer's weight and sums them.
A scorer sees all candidates at once, because the load scorers normalise
over the candidate set (min-max, as the reference EPP): the least loaded
candidate scores 1, the most loaded 0, and equal loads all score 1.

Scorers may keep state: `picked` tells them where a request went (the prefix
scorer remembers the prompt's blocks there), `forget` that an endpoint left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from epp.scheduling.endpoint import Endpoint
from epp.scheduling.request import InferenceRequest
from epp.scheduling.spec import BuildContext


class Scorer(Protocol):
    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        """One score in [0, 1] per endpoint, in the same order. The caller
        does not modify the list and reads it before telling the scorer of
        a pick, so a scorer may return the same list again and update it
        (the scheduler may read it again after the pick, to follow such an
        update)."""
        ...

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """`request` was sent to `endpoint`."""
        ...

    def forget(self, address: str) -> None:
        """The endpoint at `address` left the pool."""
        ...


@runtime_checkable
class SparseScorer(Scorer, Protocol):
    """A scorer that rates most endpoints 0 for most requests (prefix
    affinity): it can name just the others, so the scheduler adds their
    scores instead of summing a column of zeros."""

    def sparse_scores(self, request: InferenceRequest) -> Mapping[str, float]:
        """Score by endpoint address; an endpoint not named scores 0. A map
        once returned is never modified, by the scorer or the caller: the
        same map returned again means the same scores (the scheduler keeps
        the totals it summed from it)."""
        ...


def lower_is_better(values: Sequence[float]) -> list[float]:
    """(max - v) / (max - min) for each value; all 1.0 when they are equal."""
    high = max(values)
    low = min(values)
    if high == low:
        return [1.0] * len(values)
    scale = 1.0 / (high - low)
    return [(high - value) * scale for value in values]


class PerCandidates:
    """One value per candidate, computed once per candidate sequence.

    The scheduler passes the same sequence object again while the pool and
    the filters' answers do not change; endpoints and sequences are
    immutable, so what was derived from them stays true. The cache holds the
    sequence, so its identity cannot be reused by another object.
    """

    __slots__ = ("_candidates", "_derive", "_values")

    def __init__(self, derive: Callable[[Endpoint], Any]) -> None:
        self._derive = derive
        self._candidates: Sequence[Endpoint] | None = None
        self._values: list[Any] = []

    def of(self, candidates: Sequence[Endpoint]) -> list[Any]:
        if candidates is not self._candidates:
            self._values = list(map(self._derive, candidates))
            self._candidates = candidates
        return self._values


class StatelessScorer:
    """A scorer that depends only on the snapshot it is shown."""

    __slots__ = ()

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        pass

    def forget(self, address: str) -> None:
        pass


class QueueScorer:
    """Shorter waiting queue is better.

    The queue of an endpoint is its scraped waiting count plus the requests
    this scheduler sent it since that scrape: without them, every request
    placed between two scrapes would see the same queues and pile onto the
    same endpoint. Counts are keyed by the observed `Endpoint` object, which
    the data layer replaces at every scrape, so a scrape resets them.

    The queues of the latest candidate sequence are kept and a pick adds one
    to the chosen one. A shorter sequence (the candidates with room, scored
    when the choice had none) is scored apart and leaves them kept. Its
    score alone is updated when the lowest and highest queues stay as they
    were (the common case); otherwise all are recomputed at the next `score`.
    """

    __slots__ = (
        "_candidates",
        "_high",
        "_latest",
        "_loads",
        "_low",
        "_positions",
        "_scale",
        "_scores",
        "_sent",
    )

    def __init__(self) -> None:
        self._sent: dict[Endpoint, int] = {}
        self._latest: dict[str, Endpoint] = {}
        self._candidates: Sequence[Endpoint] | None = None
        self._loads: list[float] = []
        self._positions: dict[Endpoint, int] = {}
        self._scores: list[float] | None = None
        self._high = self._low = self._scale = 0.0

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        if endpoints is not self._candidates:
            sent = self._sent
            if len(endpoints) < len(self._loads):
                # Fewer than the kept candidates (likely those of them with
                # room, when the choice had none): scored apart, so the kept
                # ones stay for the next request (bench.instructions).
                return lower_is_better([e.metrics.waiting + sent.get(e, 0) for e in endpoints])
            self._loads = [
                endpoint.metrics.waiting + sent.get(endpoint, 0) for endpoint in endpoints
            ]
            self._positions = {endpoint: index for index, endpoint in enumerate(endpoints)}
            self._candidates = endpoints
            self._scores = None
        scores = self._scores
        if scores is None:
            loads = self._loads
            self._high = high = max(loads)
            self._low = low = min(loads)
            if high == low:
                scores = [1.0] * len(loads)
            else:
                self._scale = scale = 1.0 / (high - low)
                scores = [(high - load) * scale for load in loads]
            self._scores = scores
        return scores

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        previous = self._latest.get(endpoint.address)
        if previous is not endpoint:
            if previous is not None:
                del self._sent[previous]
            self._latest[endpoint.address] = endpoint
        self._sent[endpoint] = self._sent.get(endpoint, 0) + 1
        position = self._positions.get(endpoint)
        if position is None:
            return
        loads = self._loads
        load = loads[position]
        loads[position] = load + 1
        scores = self._scores
        if scores is None:
            return
        low = self._low
        if load + 1 <= self._high and (load > low or low in loads):
            scores[position] = (self._high - (load + 1)) * self._scale
        else:
            self._scores = None

    def forget(self, address: str) -> None:
        previous = self._latest.pop(address, None)
        if previous is not None:
            del self._sent[previous]


class KVCacheScorer(StatelessScorer):
    """More free KV cache is better: 1 - usage. The scores of the latest
    candidate sequence are kept (as `PerCandidates` does, written out: this
    runs for every request), unless it is shorter than the kept one (as
    `QueueScorer`'s)."""

    __slots__ = ("_candidates", "_free")

    def __init__(self) -> None:
        self._candidates: Sequence[Endpoint] | None = None
        self._free: list[float] = []

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        if endpoints is not self._candidates:
            free = [1.0 - endpoint.metrics.kv_usage for endpoint in endpoints]
            if len(free) < len(self._free):
                return free  # scored apart, as `QueueScorer` does
            self._free = free
            self._candidates = endpoints
        return self._free


class RunningRequestsScorer(StatelessScorer):
    """Fewer running requests is better."""

    __slots__ = ()

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return lower_is_better([endpoint.metrics.running for endpoint in endpoints])


class LoraAffinityScorer(StatelessScorer):
    """Where the target adapter is active 1.0; where an adapter slot is free
    0.8; where the adapter is waiting to load 0.6; elsewhere 0."""

    __slots__ = ()

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        target = request.target_model
        scores = []
        for endpoint in endpoints:
            metrics = endpoint.metrics
            if target in metrics.lora_running:
                scores.append(1.0)
            elif len(metrics.lora_running) < metrics.lora_max:
                scores.append(0.8)
            elif target in metrics.lora_waiting:
                scores.append(0.6)
            else:
                scores.append(0.0)
        return scores


class LoadAwareScorer(StatelessScorer):
    """An empty waiting queue scores 0.5; a queue of q scores
    0.5 x (1 - q / threshold), 0 from `threshold` on (the reference's
    load-aware-scorer)."""

    __slots__ = ("threshold",)

    def __init__(self, threshold: float = 128) -> None:
        self.threshold = float(threshold)

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        threshold = self.threshold
        return [
            0.5 if waiting == 0 else 0.5 * (1.0 - min(waiting, threshold) / threshold)
            for waiting in (endpoint.metrics.waiting for endpoint in endpoints)
        ]


class ActiveRequestScorer(StatelessScorer):
    """Fewer requests in flight from this EPP is better: a count at or
    below `idle_threshold` scores 1, others (max - count) / max x
    `max_busy_score`. Counts are the concurrency gate's, exact between
    scrapes (the reference reads its inflight-load-producer)."""

    __slots__ = ("_in_flight", "idle_threshold", "max_busy_score")

    def __init__(
        self, in_flight: Callable[[str], int], idle_threshold: int = 0, max_busy_score: float = 1.0
    ) -> None:
        self._in_flight = in_flight
        self.idle_threshold = idle_threshold
        self.max_busy_score = max_busy_score

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        counts = [self._in_flight(endpoint.address) for endpoint in endpoints]
        highest = max(counts, default=0)
        idle, busy = self.idle_threshold, self.max_busy_score
        return [1.0 if count <= idle else (highest - count) / highest * busy for count in counts]


class ContextLengthAwareScorer(StatelessScorer):
    """Prefers endpoints whose label (`min-max` tokens) fits the prompt:
    inside the range 0.3 + 0.7 x (0.7 x width score + 0.3 x headroom), the
    narrower and roomier the better; outside 0.3 / (1 + distance / 1000);
    no label 0.5, a malformed one 0. With `filtering`, it also drops
    endpoints whose range excludes the prompt (unlabelled ones stay)."""

    __slots__ = ("filtering", "label")

    def __init__(self, label: str, filtering: bool = False) -> None:
        self.label = label
        self.filtering = filtering

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        tokens = request.input_tokens
        return [self._score(tokens, endpoint.labels.get(self.label)) for endpoint in endpoints]

    def filter(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if not self.filtering:
            return endpoints
        tokens = request.input_tokens
        kept = []
        for endpoint in endpoints:
            text = endpoint.labels.get(self.label)
            if text is None:
                kept.append(endpoint)
                continue
            bounds = context_range(text)
            if bounds is not None and bounds[0] <= tokens <= bounds[1]:
                kept.append(endpoint)
        return kept

    @staticmethod
    def _score(tokens: int, text: str | None) -> float:
        if text is None:
            return 0.5
        bounds = context_range(text)
        if bounds is None:
            return 0.0
        low, high = bounds
        if low <= tokens <= high:
            width = high - low
            if width == 0:
                return 1.0
            raw = 0.7 / (1.0 + width / 10000.0) + 0.3 * (high - tokens) / width
            return 0.3 + raw * 0.7
        distance = tokens - high if tokens > high else low - tokens
        return 0.3 / (1.0 + distance / 1000.0)


class HeaderLabelAffinityScorer(StatelessScorer):
    """Endpoints whose label `label_key` equals the request's header
    `header` score 1, others 0; without the header (or with it empty) all
    score 0."""

    __slots__ = ("header", "label_key")

    def __init__(self, header: str, label_key: str) -> None:
        self.header = header
        self.label_key = label_key

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        wanted = request.headers.get(self.header, "")
        if not wanted:
            return [0.0] * len(endpoints)
        key = self.label_key
        return [1.0 if endpoint.labels.get(key) == wanted else 0.0 for endpoint in endpoints]


def context_range(text: str) -> tuple[int, int] | None:
    """(min, max) from a `min-max` label value, or None when malformed."""
    low, sep, high = text.partition("-")
    try:
        bounds = int(low.strip()), int(high.strip())
    except ValueError:
        return None
    return bounds if sep and bounds[0] <= bounds[1] else None


# -- factories (the registry's scheduling plugin types build through these) --


def queue_scorer(context: BuildContext) -> QueueScorer:
    return QueueScorer()


def kv_cache_scorer(context: BuildContext) -> KVCacheScorer:
    return KVCacheScorer()


def running_requests_scorer(context: BuildContext) -> RunningRequestsScorer:
    return RunningRequestsScorer()


def lora_affinity_scorer(context: BuildContext) -> LoraAffinityScorer:
    return LoraAffinityScorer()


def load_aware_scorer(context: BuildContext, threshold: int = 128) -> LoadAwareScorer:
    return LoadAwareScorer(threshold)


def active_request_scorer(
    context: BuildContext, idle_threshold: int = 0, max_busy_score: float = 1.0
) -> ActiveRequestScorer:
    gate = context.gate
    in_flight = gate.in_flight_at if gate is not None else (lambda address: 0)
    return ActiveRequestScorer(in_flight, idle_threshold, max_busy_score)


def context_length_scorer(
    context: BuildContext, label: str, filtering: bool = False
) -> ContextLengthAwareScorer:
    return ContextLengthAwareScorer(label, filtering)


def header_label_affinity_scorer(
    context: BuildContext, header: str, label_key: str
) -> HeaderLabelAffinityScorer:
    return HeaderLabelAffinityScorer(header, label_key)
