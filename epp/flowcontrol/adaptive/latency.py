"""The latency signal: each endpoint's recent inter-token latency (the
median of its server's histogram buckets, else their mean, else its
streamed responses'), and how it compares to the rest of the pool.

The estimator owns what the comparison does to the limit (`slow_down`);
this module owns the readings and the reference they are judged against.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from math import exp
from typing import TYPE_CHECKING

from epp.flowcontrol.adaptive.inputs import Sample

if TYPE_CHECKING:
    from epp.flowcontrol.adaptive.estimator import LimitEstimator


RECENT_SECONDS = 3.5
"""An endpoint's recent inter-token latency, from a server's histogram
without buckets: the token-weighted mean of the intervals between
samples, an interval weighing less by e^(-age / RECENT_SECONDS)."""

RECENT_WINDOW = 8.0
"""An endpoint's recent inter-token latency, from its server's buckets:
the median of what they grew by over about this many seconds (from the
newest sample at least this old to the latest)."""

LATENCY_WEIGHT = 0.2
"""Without the server's histogram, the weight of a response in an
endpoint's recent latency (an exponential average over about the last
five responses)."""

LATENCY_SAMPLES = 8
"""Without the server's histogram, the responses an endpoint must have
seen before its latency is compared."""

REFERENCE_SECONDS = 10.0
"""An endpoint's reference (how its latency compares to the pool's when it
runs full at a healthy speed) and its steady latency (the same comparison
at any time) are averages over the comparisons, a comparison weighing less
by e^(-age / REFERENCE_SECONDS)."""

REFERENCE_SPAN = 10.0
"""Seconds of comparisons an endpoint must have fed its reference, since
it was found full, before it is judged."""


class LatencySignal:
    """One endpoint's recent latency and its reference.

    `itl`: the median of what its server's buckets grew by over about
    `RECENT_WINDOW` (0 when none), else `mean_itl`. `reference`: its
    latency over the median of the others' while it ran full at a healthy
    speed; `steady`: the same comparison at any time.
    """

    __slots__ = (
        "compared_at",
        "evidence",
        "itl_bounds",
        "itl_history",
        "itl_last",
        "itl_median",
        "recent_count",
        "recent_sum",
        "reference",
        "reference_limit",
        "reference_sum",
        "reference_weight",
        "responses",
        "server_itl",
        "steady",
    )

    def __init__(self) -> None:
        self.recent_sum = 0.0
        self.recent_count = 0.0
        """Its recent inter-token latency, as a decayed sum (s) and count."""
        self.responses = 0
        """Responses that fed it (without the server's histogram)."""
        self.server_itl = False
        """Whether its server reports its inter-token latency histogram (the
        latency of responses is then not used)."""
        self.itl_last: tuple[float, float, float] | None = None
        """The histogram's sum and count at the last sample that used them,
        and that sample's time."""
        self.itl_bounds: tuple[float, ...] = ()
        """Its buckets' upper bounds."""
        self.itl_history: deque[tuple[float, tuple[float, ...], float]] = deque()
        """The samples' buckets (time, buckets, count) since the newest one
        at least `RECENT_WINDOW` old (empty: no buckets, the mean is used)."""
        self.itl_median = 0.0
        """The median of what the buckets grew by over that window (0: none)."""
        self.compared_at: float | None = None
        """When its latency was last compared to the pool's."""
        self.reference = 0.0
        """Its latency over the median of the others' while it ran full at a
        healthy speed (its own speed against the pool's): the mean of the
        comparisons, each weighted by the time it covers and its age."""
        self.reference_sum = 0.0
        self.reference_weight = 0.0
        self.steady = 0.0
        """The same at any time: a slowed server's recovery is judged on
        it, so that one lucky interval does not end it."""
        self.evidence = 0.0
        """Seconds of comparisons that fed the reference."""
        self.reference_limit = 0
        """The limit the reference was measured at."""

    @property
    def itl(self) -> float:
        """Its recent inter-token latency (s; 0 when none is known): the
        median of its server's recent buckets, else the mean."""
        if self.itl_median > 0.0:
            return self.itl_median
        return self.mean_itl

    @property
    def mean_itl(self) -> float:
        """Its recent mean inter-token latency (s; 0 when none is known): its
        steps' mean length as its decoding requests saw them, long prefill
        steps included."""
        return self.recent_sum / self.recent_count if self.recent_count else 0.0

    def known(self) -> bool:
        """Whether its recent latency says enough to compare."""
        if self.server_itl:
            return self.recent_count > 0.0
        return self.responses >= LATENCY_SAMPLES

    def observe_response(self, itl: float) -> None:
        """A streamed response from this server ended: `itl` is its mean
        time per output token after the first. Not used when the server
        reports its own histogram (it says the same, at every sample)."""
        if not self.server_itl:
            keep = 1.0 - LATENCY_WEIGHT
            self.recent_sum = self.recent_sum * keep + itl
            self.recent_count = self.recent_count * keep + 1.0
            self.responses += 1

    def observe(self, sample: Sample, now: float) -> None:
        """The server's latency histogram at this sample: what it grew by
        since the last sample that used it is the interval's mean."""
        total = sample.itl_sum
        count = sample.itl_count
        if count <= 0.0:
            return  # not reported, or no token yet
        if not self.server_itl:
            self.server_itl = True
            self.recent_sum = self.recent_count = 0.0
        last = self.itl_last
        if last is not None and count == last[1]:
            return  # no token since: the next interval covers this one
        self.itl_last = (total, count, now)
        restarted = last is not None and (count < last[1] or total < last[0])
        self._buckets(sample.itl_bounds, sample.itl_buckets, count, now, restarted)
        if last is None or restarted:
            return  # the first reading, or the server restarted
        keep = exp(-(now - last[2]) / RECENT_SECONDS)
        self.recent_sum = self.recent_sum * keep + (total - last[0])
        self.recent_count = self.recent_count * keep + (count - last[1])

    def _buckets(
        self,
        bounds: tuple[float, ...],
        buckets: tuple[float, ...],
        count: float,
        now: float,
        restarted: bool,
    ) -> None:
        """Keep the samples' buckets over `RECENT_WINDOW` and the median of
        what they grew by: O(1) amortized, and the median stops at its
        bucket."""
        history = self.itl_history
        if not buckets:
            history.clear()
            self.itl_median = 0.0
            return
        if restarted or bounds != self.itl_bounds:
            history.clear()  # its counters, or its bounds, start again
            self.itl_bounds = bounds
        history.append((now, buckets, count))
        while len(history) > 2 and history[1][0] <= now - RECENT_WINDOW:
            history.popleft()
        base = history[0]
        grown = count - base[2]
        self.itl_median = median_grown(bounds, base[1], buckets, grown) if grown > 0.0 else 0.0

    def compare(self, relative: float, now: float, full: bool, limit: int) -> float | None:
        """Its recent latency is `relative` times the median of the other
        endpoints' at `now`. Fed to the reference while it runs `full` at
        `limit`, at least the size the reference was taken at (a smaller
        batch has shorter steps: its latency is no reference for the full
        one). Returns how much `relative` grew over the reference, once the
        reference has `REFERENCE_SPAN` seconds (else None)."""
        last = self.compared_at
        self.compared_at = now
        if last is None:
            self.steady = relative
            return None
        elapsed = now - last
        keep = exp(-elapsed / REFERENCE_SECONDS)
        self.steady = self.steady * keep + relative * (1.0 - keep)
        if full and limit >= self.reference_limit:
            self.reference_sum = self.reference_sum * keep + relative * elapsed
            self.reference_weight = self.reference_weight * keep + elapsed
            self.reference = self.reference_sum / self.reference_weight
            self.evidence += elapsed
            self.reference_limit = limit
        if self.evidence < REFERENCE_SPAN:
            return None
        return relative / self.reference

    def forget_reference(self) -> None:
        """Its size changed: its latency is learned again at the new one."""
        self.reference_limit = 0
        self.evidence = self.reference = 0.0
        self.reference_sum = self.reference_weight = 0.0


def compare_to_pool(estimators: Iterable[LimitEstimator], now: float) -> None:
    """Compare each endpoint's recent latency to the median of the others'
    (`LimitEstimator.compare`): a pool of different servers, or a load that
    slows every server alike, changes no comparison, and none depends on
    when a reference was taken. O(E log E), once per snapshot."""
    rated = sorted(
        (estimator.latency.itl, index, estimator)
        for index, estimator in enumerate(estimators)
        if estimator.found and estimator.latency.known()
    )
    if len(rated) >= 2:
        latencies = [itl for itl, _, _ in rated]
        for position, (itl, _, estimator) in enumerate(rated):
            estimator.compare(itl / median_without(latencies, position), now)


def median_grown(
    bounds: Sequence[float], before: Sequence[float], after: Sequence[float], grown: float
) -> float:
    """The median of the `grown` observations a histogram's buckets (upper
    bounds `bounds`) gained from `before` to `after` (cumulative counts),
    interpolated linearly inside its bucket as Prometheus'
    `histogram_quantile` does: the largest bound when it lies past them
    all. O(buckets up to the median's)."""
    half = grown * 0.5
    lower = below = 0.0
    # No `strict=`: calling zip with a keyword costs more than this loop
    # (per endpoint per sample, bench.instructions); the histogram's reader
    # gives as many counts as bounds.
    for bound, now, then in zip(bounds, after, before):  # noqa: B905
        held = now - then
        if held >= half:
            if held == below:
                return bound
            return lower + (bound - lower) * (half - below) / (held - below)
        lower, below = bound, held
    return lower


def median_without(ordered: Sequence[float], position: int) -> float:
    """The median of `ordered` (sorted, two or more) without the value at
    `position`, in O(1)."""
    count = len(ordered) - 1
    middle = count // 2

    def at(index: int) -> float:
        return ordered[index if index < position else index + 1]

    return at(middle) if count % 2 else (at(middle - 1) + at(middle)) / 2
