"""Adaptive per-endpoint in-flight limits, with headroom for higher bands.

No fixed number fits every pool: a server that batches 8 is flooded by 32
credits, one that batches 256 is starved by them. So each endpoint's limit
is learned from what the server itself reports at every scrape (requests
running and waiting), and the in-flight credits (taken at dispatch, given
back at completion) keep holding between scrapes, so nothing overshoots.

Parts:
- `LimitEstimator`: one endpoint's limit, fed each fresh metrics sample.
  Pure; the sample's timestamp is its clock.
- `AdaptiveGate`: the `Gate`, and the scheduler's per-endpoint `Credits`.
  It reads the pool snapshot when its version moves (one pass over the
  endpoints per snapshot, none per request), keeps one estimator per
  endpoint and answers `has_room(endpoint, priority)` with the usage-limit
  policy (`epp.flowcontrol.usagelimits`) applied to the learned limit.

The control law (measured against the alternatives in
`epp/flowcontrol/README.md`):
- pending budget: at most `pending` requests an endpoint was not yet seen
  running (its queue at the last sample, plus what was sent since). This
  alone keeps the server's queue, where priority no longer reaches a
  request, at about one request, whatever the limit says; and it paces a
  new endpoint's growth to what the server admits. The first token of a
  streamed response (`on_first_token`) shows its request running before
  the next sample does, so the budget refills at the server's pace (a
  step), not the scrape's. A whole response gives no such sign, so the
  budget is also sized at each sample from what the server took since
  the one before (its queue then, plus what it was sent, less its queue
  now). Beside a queue younger than the interval (a request caught
  between two steps, which its next step admits) a server may be sent what
  it took; with no queue, twice that, so its intake can grow to meet the
  arrivals. A server still searching for its size grows so only after two
  samples with no queue, and not after a request waited there a whole
  interval (its queue outgrew what it was sent over the last two
  intervals: a request sent while a sample was on its way is counted in
  the interval before but not yet shown) until it runs less than half its
  limit with no queue. A server of known size grows so up to 90% of its
  limit, is sent one at a time after a request waited there a whole
  interval, and may be sent up to half its limit at once while it runs
  less than half (its requests may finish between samples, when the pace
  of one per sample would starve it). Neither may have more than two
  pending while its steps (its inter-token latency) last half the sampling
  interval or more: what it is sent during a step waits for the step's
  end (a large server's prefill steps), and would be its queue at the
  next sample.
- limit = the most requests the server was seen running. While probing,
  the gate lets one more through; if the server runs it, the limit grows
  at the next sample. A new endpoint probes until a probe finds no room
  for `full_after` seconds (the server is full: max_num_seqs or its KV
  cache); after that a probe runs every `probe_interval` seconds while the
  limit holds requests back, on at most a quarter of the pool's endpoints
  at once (`PROBE_SHARE`): a probe lets the bands below the top fill its
  endpoint's headroom, so the top band finds its slots on the others.
- the limit drops to the most the server ran over a `window` in which it
  kept a queue half the time and never came within 10% of the limit (it
  restarted smaller, slowed down or its KV cache holds fewer requests), and
  to what it runs now after a window in which it kept a queue throughout
  while running less than the limit (it is still draining what it held).
- latency: a server's inter-token latency histogram (`itl_bounds`,
  `itl_buckets`, `itl_sum`, `itl_count` of its samples: vLLM's and
  SGLang's own) gives the distribution of its tokens' latency between
  two samples; an endpoint's recent latency is the median of what its
  buckets grew by over about `RECENT_WINDOW`. The median, not the mean: a
  step that prefills long prompts stalls every request it decodes, and
  those few long steps made most of the mean, so a server that slowed and
  admitted less (prefilling less) showed under twice the pool's mean while
  it decoded three times slower. Without buckets, the token-weighted mean
  of the intervals over about `RECENT_SECONDS`. A server without the
  histogram is judged on its streamed responses' time per output token
  instead (`observe_latency`, known at a response's
  end). At each snapshot every endpoint's recent latency is compared to
  the median of the others' (`compare`); its reference is that ratio while
  it ran full at the size it was found at, at a healthy speed, so a pool
  of different servers, or a load that slows every server alike, changes
  nothing, whenever the reference was taken. When the ratio grew `slower`
  (2) times over the reference, the limit is divided by that factor and
  holds until the ratio, averaged over `REFERENCE_SECONDS` and measured
  while the server runs within its limit, is back under `recovered`
  (1.25) times the reference. A server that slows down without queueing (a
  throttled GPU) then holds fewer requests, each of which waits less, and
  a top-band request never goes there while any endpoint did not slow
  down: it waits less in the EPP for a slot at a server that did.
- headroom: bands below the top may fill only their share of the limit
  (the usage-limit policy; by default the reference's priority-holdback
  shape, at least one slot held back), so a top-band arrival finds a free
  batch slot. A top-band request never takes a probe slot once the
  endpoint was seen full (it would wait at a full server), and prefers an
  endpoint with nothing pending and no probe under way (and never takes a
  slowed one, above).
- a sample is used once (`updated_at` moves); failed samples are ignored.
  An endpoint with no sample for `blind_after` (or none yet: its metrics
  cannot be read) is not learned from: it gets the fixed limit
  (`maxPerEndpoint`, as the concurrency gate) and no pending budget, so a
  pool without metrics works as before. A request that completes before a
  sample showed it running comes off the pending count. When most requests
  complete between two samples, the samples cannot see what the server
  runs, so they cannot teach a limit either: the endpoint gets the fixed
  limit too, until its requests outlast the sampling interval again. An endpoint that
  leaves the pool is forgotten; back, it starts again.

Cost: `has_room` O(1) (dict lookups), O(endpoints) for a top-band request
whose chosen endpoint has requests pending, once per change of the pool or
of the in-flight counts; a new snapshot O(E log E) for E endpoints (the
latency comparison sorts them; the probes under way are counted in O(E));
a sample's latency O(1) amortized plus its median's, which walks the
buckets up to the median's; a response's O(1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil, exp, inf
from typing import Protocol, TypeVar

from epp.flowcontrol.request import FlowRequest, State
from epp.flowcontrol.usagelimits import DEFAULT_USAGE_LIMITS, UsageLimitPolicy


class Sample(Protocol):
    """One scrape of a model server (`EndpointMetrics` is one)."""

    @property
    def waiting(self) -> float: ...
    @property
    def running(self) -> float: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def updated_at(self) -> float | None: ...
    @property
    def failing(self) -> bool: ...
    @property
    def itl_sum(self) -> float: ...
    @property
    def itl_count(self) -> float: ...
    @property
    def itl_bounds(self) -> tuple[float, ...]: ...
    @property
    def itl_buckets(self) -> tuple[float, ...]: ...


class Observed(Protocol):
    """An endpoint and its latest sample (`Endpoint` is one)."""

    @property
    def address(self) -> str: ...
    @property
    def metrics(self) -> Sample: ...


class Observations(Protocol):
    """A pool snapshot (`PoolSnapshot` is one): `version` moves on every change."""

    @property
    def endpoints(self) -> Sequence[Observed]: ...
    @property
    def version(self) -> int: ...


@dataclass(slots=True, frozen=True)
class AdaptiveLimits:
    """The estimator's settings. None of them is a per-deployment number:
    they bound the search and set its pace, not its result.

    `initial`: the limit of a new endpoint (safe: below any real batch).
    `maximum`: no endpoint's limit grows past it (a resource bound).
    `pending`: requests an endpoint may hold that it was not yet seen
    running (its queue, plus what was sent since its last sample).
    `full_after`: how long (s) a probe may find no room before the limit
    is held (a server that takes the probe is between two steps at most
    this long).
    `probe_interval`: once the size is known, how often (s) the limit tries
    one more while the limit holds requests back.
    `window`: how long (s) a server must keep a queue (half its samples)
    while running less than 90% of its limit for the limit to drop to the
    most it ran.
    `blind_after`: an endpoint with no sample newer than this (s), or none
    yet, is not learned from: the gate's fixed limit applies, no budget.
    `slower`: an endpoint whose inter-token latency, over the median of
    the others', grew this many times over what it was when it ran full has
    slowed down: its limit is divided by that factor. It may grow again
    once that factor, averaged longer, is back under `recovered`.
    """

    initial: int = 4
    maximum: int = 1024
    pending: int = 1
    full_after: float = 1.0
    probe_interval: float = 5.0
    window: float = 2.0
    blind_after: float = 1.0
    slower: float = 2.0
    recovered: float = 1.25


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

SHRINK = 0.9
"""A server must run fewer than this share of its limit to lower it (the
KV-cache's capacity moves with the request mix; the pending budget, not
the limit, keeps the queue short)."""


class LimitEstimator:
    """One endpoint's learned in-flight limit (see the module docstring).

    `limit` >= 1 always: the most requests the server has been seen running
    at once, lowered when it keeps a queue while running fewer. `probing`:
    whether the gate lets one more through to find out whether the server
    runs more (from the start until the server is first seen full, then for
    `full_after` every `probe_interval`). `pending`: requests sent there
    that no sample has shown running yet. `adjustments` counts the limit's
    changes; `seen` is the timestamp of the last sample used.
    """

    __slots__ = (
        "adjustments",
        "budget",
        "compared_at",
        "crowded",
        "done",
        "done_unseen",
        "evidence",
        "factor",
        "found",
        "itl_bounds",
        "itl_history",
        "itl_last",
        "itl_median",
        "limit",
        "most",
        "pending",
        "probe_since",
        "probing",
        "queue",
        "queued",
        "recent_count",
        "recent_sum",
        "reference",
        "reference_limit",
        "reference_sum",
        "reference_weight",
        "responses",
        "running",
        "samples",
        "seen",
        "seen_seq",
        "sent",
        "sent_before",
        "sent_seq",
        "server_itl",
        "settings",
        "slowed",
        "steady",
        "too_fast_to_see",
        "window_end",
    )

    def __init__(self, settings: AdaptiveLimits) -> None:
        self.settings = settings
        self.limit = max(1, min(settings.initial, settings.maximum))
        self.probing = True
        self.found = False
        """Whether the server was ever seen full (a probe found no room)."""
        self.probe_since: float | None = None
        """When the probe began or last succeeded (None: not yet seen)."""
        self.window_end: float | None = None
        """When the current window of samples ends (None: none open)."""
        self.most = 0
        """The most requests the server ran in the current window."""
        self.queued = 0
        """The window's samples that showed a queue at the server."""
        self.samples = 0
        self.pending = 0
        self.sent = 0
        """Requests sent here since the last sample."""
        self.sent_before = 0
        """Requests sent here in the interval before that."""
        self.sent_seq = 0
        """The newest (by the core's sequence number) request sent here."""
        self.seen_seq = 0
        """`sent_seq` when the last sample was used: requests after it are
        the ones counted as pending."""
        self.queue = 0
        """The server's queue at the last sample."""
        self.seen: float | None = None
        self.adjustments = 0
        self.budget = settings.pending
        """Requests it may have pending until the next sample (`_budget`)."""
        self.crowded = False
        """Whether a request waited there a whole sampling interval (its
        queue outgrew what it was sent since the sample before): it was seen
        full, so its intake no longer sizes the budget."""
        self.done = 0
        """Requests completed since the last sample."""
        self.done_unseen = 0
        """Of those, the ones sent after the last sample: no sample saw them."""
        self.too_fast_to_see = False
        """Whether most requests completed unseen in the last interval with
        completions: `running` cannot show what the server runs."""
        self.running = 0
        """The server's running count at the last sample."""
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
        self.slowed = False
        """Its latency grew more than the pool's: the limit holds (no probe)."""
        self.factor = 1.0
        """How much more its latency grew than the pool's, at the last comparison."""

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

    def latency_known(self) -> bool:
        """Whether its recent latency says enough to compare."""
        if self.server_itl:
            return self.recent_count > 0.0
        return self.responses >= LATENCY_SAMPLES

    def observe_latency(self, itl: float) -> None:
        """A streamed response from this server ended: `itl` is its mean
        time per output token after the first. Not used when the server
        reports its own histogram (it says the same, at every sample)."""
        if not self.server_itl:
            keep = 1.0 - LATENCY_WEIGHT
            self.recent_sum = self.recent_sum * keep + itl
            self.recent_count = self.recent_count * keep + 1.0
            self.responses += 1

    def _server_latency(self, sample: Sample, now: float) -> None:
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
        self._server_buckets(sample.itl_bounds, sample.itl_buckets, count, now, restarted)
        if last is None or restarted:
            return  # the first reading, or the server restarted
        keep = exp(-(now - last[2]) / RECENT_SECONDS)
        self.recent_sum = self.recent_sum * keep + (total - last[0])
        self.recent_count = self.recent_count * keep + (count - last[1])

    def _server_buckets(
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

    def compare(self, relative: float, now: float) -> int:
        """Its recent latency is `relative` times the median of the other
        endpoints' at `now`. Fed to the reference while it runs full at the
        size it was found at, at a healthy speed; once the reference has
        `REFERENCE_SPAN` seconds, the limit follows how much `relative`
        grew over it (`slow_down`). Returns the change of the limit."""
        last = self.compared_at
        self.compared_at = now
        if last is None:
            self.steady = relative
            return 0
        elapsed = now - last
        keep = exp(-elapsed / REFERENCE_SECONDS)
        self.steady = self.steady * keep + relative * (1.0 - keep)
        limit = self.limit
        if (
            self.found
            and not self.slowed
            and self.factor < self.settings.recovered
            and self.running >= limit * SHRINK
            and limit >= self.reference_limit
        ):
            # A smaller batch has shorter steps: its latency is no
            # reference for the full one.
            self.reference_sum = self.reference_sum * keep + relative * elapsed
            self.reference_weight = self.reference_weight * keep + elapsed
            self.reference = self.reference_sum / self.reference_weight
            self.evidence += elapsed
            self.reference_limit = limit
        if self.evidence < REFERENCE_SPAN:
            return 0
        return self.slow_down(relative / self.reference)

    def slow_down(self, factor: float) -> int:
        """Its latency grew `factor` times more than the pool's since its
        reference: hold its limit at the reference's divided by `factor`
        (never grow it while slowed). Returns the change."""
        settings = self.settings
        self.factor = factor
        if factor >= settings.slower:
            self.slowed = True
            self.probing = False
            target = max(1, int(self.reference_limit / factor))
            if self.limit > target:
                change = target - self.limit
                self.limit = target
                self.adjustments += 1
                return change
        elif (
            self.slowed
            and self.running <= self.limit
            and self.steady <= settings.recovered * self.reference
        ):
            # Judged on the longer average, and only once it runs what its
            # limit lets it: while it drains the batch it held it admits
            # nothing, and a step that prefills nothing is short at any speed.
            self.slowed = False
        return 0

    def observe(self, sample: Sample, binding: bool, may_probe: bool = True) -> int | None:
        """Use `sample` if it is new and was read; `binding` tells whether
        the limit held a request back since the last sample; `may_probe`,
        whether a server of known size may start a probe now (the pool's
        share of probes is not taken). Returns the change of the limit, or
        None when the sample was not used."""
        now = sample.updated_at
        if sample.failing or now is None or now == self.seen:
            return None
        last = self.seen
        self.seen = now
        self.seen_seq = self.sent_seq
        if self.done >= 2:
            self.too_fast_to_see = self.done_unseen * 2 >= self.done
        self.done = self.done_unseen = 0
        running = int(sample.running)
        waiting = int(sample.waiting)
        # What it took since the last sample: its queue then and what it
        # was sent since, less its queue now (admitted or done already).
        took = max(0, self.queue + self.sent - waiting)
        quiet = not (waiting or self.queue)
        # A request waited there a whole interval when its queue outgrew what
        # it was sent over the last two: one sent after the server was read
        # but before the sample arrived counts in the interval before, yet
        # the sample does not show it yet.
        stale = waiting > self.sent + self.sent_before
        if stale:
            self.crowded = True
        elif quiet and running < self.limit * NOT_FULL:
            # The queue that went stale waited out a long step (a burst's
            # prefills), not a full batch.
            self.crowded = False
        self.sent_before = self.sent
        self.sent = 0
        self.pending = self.queue = waiting
        self.running = running
        self._server_latency(sample, now)
        # What it is sent during a step waits for the step's end.
        long_steps = last is not None and self.mean_itl >= (now - last) * LONG_STEP
        settings = self.settings
        if self.window_end is None:
            self.window_end = now + settings.window
            self.most = self.queued = self.samples = 0
        window_end = self.window_end
        self.samples += 1
        self.queued += waiting > 0
        self.most = max(self.most, running)
        old = new = self.limit
        if self.probe_since is None:
            self.probe_since = now
        if running > old and not self.slowed:
            new = running  # it runs more than it was known to: room found
            self.probe_since = now
        elif now >= window_end:
            # A window in which the server kept a queue half the time yet
            # never ran as many as its limit: it shrank (restarted smaller,
            # or its KV cache holds fewer requests now).
            throughout = self.queued >= self.samples * QUEUED_THROUGHOUT and self.most < old
            if throughout or (self.queued * 2 >= self.samples and self.most < old * SHRINK):
                new = max(1, running if throughout and waiting else self.most)
                self.probing = False
                self.found = True
                self.probe_since = now
                self.reference_limit = 0  # its latency is learned again at its new size
                self.evidence = self.reference = 0.0
                self.reference_sum = self.reference_weight = 0.0
            self.window_end = None
        elif self.probing:
            if not (binding or waiting):
                self.probe_since = now  # nothing wanted the probe: no news
            elif now - self.probe_since >= settings.full_after:
                self.probing = False  # no room found: hold the limit
                self.found = True
                self.probe_since = now
        elif (
            binding
            and not waiting
            and not self.slowed
            and now - self.probe_since >= settings.probe_interval
        ):
            self.probing = may_probe  # else its turn comes an interval later
            self.probe_since = now
        new = min(new, settings.maximum)
        budget = self._budget(new, running, waiting, took, quiet, stale)
        if long_steps:
            # Whatever it is sent during a step waits for the step's end.
            budget = min(budget, settings.pending + 1)
        self.budget = budget
        if new == old:
            return 0
        self.limit = new
        self.adjustments += 1
        return new - old

    def _budget(
        self, limit: int, running: int, waiting: int, took: int, quiet: bool, stale: bool
    ) -> int:
        """`pending`, one more for a large server still searching (it admits
        two a step). Whole responses tell nothing before their end, so below
        its size a server is sent at the pace at which it takes requests, not
        one per sample: what it `took` since the last sample, on top of a
        queue younger than the interval (its next step admits them), or
        `INTAKE` times that with no queue, so its intake can grow to meet the
        arrivals. A server still searching grows so only after two samples
        with no queue, and not once a request waited there a whole interval
        (`stale`: `crowded`, until `NOT_FULL`). A server of known size grows so with no queue
        now, one at a time after a stale queue, never past `KEEP_PACE` of its
        limit (near the top, one at a time keeps the server's queue and the
        top band's prefill steps short), and may be sent up to `FAST_FILL`
        of its limit at once while it runs less than that: its next step
        admits them all."""
        pending = self.settings.pending
        if not self.found:
            base = pending + 1 if limit >= 64 else pending
            if self.crowded:
                return base
            if waiting:
                return max(base, waiting + took)
            return max(base, INTAKE * took if quiet else 0)
        if stale:
            return pending
        pace = waiting + took if waiting else INTAKE * took
        room = int(limit * KEEP_PACE) - running
        budget = min(max(pending, pace), max(pending, room))
        return max(budget, int(limit * FAST_FILL) - running)


FAST_FILL = 0.5
"""The share of its limit an idle server of known size may be sent at once."""

KEEP_PACE = 0.9
"""Below this share of its limit, a server of known size with no queue may
be sent as many as it took in the last sampling interval."""

QUEUED_THROUGHOUT = 0.9
"""A window in which the server kept a queue at this share of its samples
lowers the limit to the most it ran, however close to the limit: it is full
below the limit (a server that shrank, still draining the requests it held;
the 10% margin of `SHRINK` would leave one slot that is not there, and the
top band's request would wait in it)."""

NOT_FULL = 0.5
"""A server still searching that runs less than this share of its limit,
with no queue at two samples, is not full, whatever queue went stale there
before (paced one at a time, it would never be sent enough to show its
size)."""

PROBE_SHARE = 0.25
"""At most this share of the pool's endpoints (at least one) probe a known
size at once. While an endpoint probes, bands below the top may fill it to
one past its limit, its headroom included, and they hold those slots until
their requests end: were every endpoint to probe at once, as endpoints
found full together would, a top-band arrival would find no slot anywhere."""

LONG_STEP = 0.5
"""A server whose recent steps (its inter-token latency) last this share of
the sampling interval or more may have at most `pending` + 1 requests
pending: what it is sent during a step waits for the step's end."""

INTAKE = 2
"""A server still searching, with no queue, may be sent this many times
what it took in the last sampling interval (its demand may double from one
sample to the next and still be met)."""


def allowed(limit: int, ceiling: float) -> int:
    """The slots of `limit` that a band with `ceiling` may fill. A ceiling
    below 1 holds back at least one slot (the reference's comparison,
    saturation >= ceiling, would hold back none on a small limit), but
    leaves at least one (every band keeps moving on every endpoint) unless
    the ceiling is 0 (the band is closed)."""
    if ceiling >= 1.0 or limit <= 1:
        return limit if ceiling > 0.0 else 0
    if ceiling <= 0.0:
        return 0
    return max(1, limit - max(1, ceil(limit * (1.0 - ceiling) - 1e-9)))


def fits(estimator: LimitEstimator, held: int, ceiling: float) -> bool:
    """Whether a learned endpoint holding `held` requests has room for a
    band below the top with `ceiling`: its pending budget is not spent and
    it holds fewer than its limit (one more while probing) allows."""
    limit = estimator.limit
    return estimator.pending < estimator.budget and held < (
        limit + 1 if estimator.probing else allowed(limit, ceiling)
    )


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
    for bound, now, then in zip(bounds, after, before, strict=True):
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


E = TypeVar("E", bound=Observed)


class AdaptiveGate:
    """The adaptive gate: learned per-endpoint limits and the holdback.

    `pool` returns the latest snapshot. Bands are learned from the
    priorities asked about (bounded by the objectives' priorities). The
    pool as a whole is never closed: the per-endpoint credits decide, in
    `has_room`, which the scheduler asks before placing a request.
    """

    __slots__ = (
        "_all_slowed",
        "_bands",
        "_blind_after",
        "_changes",
        "_clock",
        "_estimators",
        "_idle",
        "_idle_key",
        "_in_flight",
        "_no_room",
        "_pending",
        "_pool",
        "_priorities",
        "_reopened",
        "_version",
        "blind_limit",
        "blocked",
        "in_flight",
        "settings",
        "usage",
    )

    def __init__(
        self,
        pool: Callable[[], Observations],
        clock: Callable[[], float],
        settings: AdaptiveLimits | None = None,
        usage: UsageLimitPolicy | None = None,
        blind_limit: int = 32,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self.blind_limit = blind_limit
        """The limit of an endpoint with no recent sample (0: none)."""
        self.settings = settings or AdaptiveLimits()
        self.usage = usage or DEFAULT_USAGE_LIMITS
        self._estimators: dict[str, LimitEstimator] = {}
        self._in_flight: dict[str, int] = {}
        self._priorities: list[int] = []
        self._bands: dict[int, tuple[float, bool, int]] = {}
        """Per known priority: (static ceiling, top band of several, rank)."""
        self._pending = self.settings.pending
        self._blind_after = self.settings.blind_after
        self._version: int | None = None
        self._changes = 0
        """Dispatches and completions so far (keys what `_idle_room` keeps)."""
        self._all_slowed = False
        """Whether every endpoint compared slowed down (the top band then
        takes a slowed one too)."""
        self._idle_key: tuple[int | None, int] | None = None
        self._idle = False
        self._no_room: tuple[object, int, float] | None = None
        """(endpoints, priority, oldest): `with_room` found none of these
        endpoints with room for that band, and nothing that could make room
        happened since; `oldest` is the oldest of their samples, whose
        staleness would (`may_have_room`)."""
        self._reopened: tuple[tuple[object, int, float], str] | None = None
        """(the `_no_room` forgotten, the endpoint that alone made room
        since): if a dispatch there takes that room, it holds again."""
        self.in_flight = 0
        self.blocked: set[str] = set()
        """Endpoints whose limit held back a request since their last sample."""

    # -- the Gate protocol ---------------------------------------------------

    def is_open(self, priority: int) -> bool:
        if priority not in self._bands:
            self._learn_band(priority)
        return True

    def on_dispatch(self, request: FlowRequest) -> None:
        self._changes += 1
        self.in_flight += 1
        endpoint = request.endpoint
        if endpoint is not None:
            self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1
            estimator = self._estimators.get(endpoint)
            if estimator is None:
                estimator = self._estimators[endpoint] = LimitEstimator(self.settings)
            estimator.pending += 1
            estimator.sent += 1
            if request.seq > estimator.sent_seq:
                estimator.sent_seq = request.seq
            if self._reopened is not None:
                self._took_room(endpoint, estimator)

    def on_complete(self, request: FlowRequest) -> None:
        self._changes += 1
        self.in_flight -= 1
        endpoint = request.endpoint
        if endpoint is not None:
            left = self._in_flight[endpoint] - 1
            if left:
                self._in_flight[endpoint] = left
            else:
                del self._in_flight[endpoint]
            estimator = self._estimators.get(endpoint)
            if estimator is not None:
                estimator.done += 1
                if request.seq > estimator.seen_seq:
                    # Sent after the last sample, so counted as pending
                    # unless its first token came: done, it is not waiting.
                    estimator.done_unseen += 1
                    if estimator.pending and not request.running:
                        estimator.pending -= 1
            if self._no_room is not None or self._reopened is not None:
                self._reopen(endpoint, estimator)

    def observe_latency(self, request: FlowRequest, itl: float) -> None:
        """`request`'s streamed response ended with `itl` seconds per output
        token after the first (the shell measures it on the response)."""
        endpoint = request.endpoint
        estimator = self._estimators.get(endpoint) if endpoint is not None else None
        if estimator is not None and itl > 0.0:
            estimator.observe_latency(itl)

    def on_first_token(self, request: FlowRequest) -> bool:
        """`request`'s first output token reached the EPP: its server runs
        it. If it was sent after the endpoint's last sample it no longer
        counts as pending, so the endpoint may take the next request now
        rather than at its next sample. Returns whether that made room (the
        shell then pokes the core)."""
        if request.running or request.state is not State.DISPATCHED:
            return False
        request.running = True
        endpoint = request.endpoint
        estimator = self._estimators.get(endpoint) if endpoint is not None else None
        if estimator is None or not estimator.pending or request.seq <= estimator.seen_seq:
            return False
        estimator.pending -= 1
        self._changes += 1
        if self._no_room is not None or self._reopened is not None:
            self._reopen(endpoint, estimator)
        return True

    # -- the scheduler's credits -----------------------------------------------

    def has_room(self, endpoint: str, priority: int = 0) -> bool:
        """Whether a request of band `priority` may go to `endpoint` now.

        A top-band request also skips an endpoint that has requests pending
        (sent, not yet seen running) or a probe under way while another with
        room has neither: it would share their prefill step there, or wait
        behind a probe that finds the server full."""
        pool = self._pool()
        if pool.version != self._version:
            self._observe(pool)
        return self._check(endpoint, priority, self._clock())

    def may_have_room(self, endpoints: Sequence[Observed], priority: int = 0) -> bool:
        """False when `with_room(endpoints, priority)` found none of these
        very endpoints with room, and nothing that could make room happened
        since: no new snapshot, no completion there that the pending budget
        does not hold back, no first token, no new band, and no sample
        turned stale (then the fixed limit applies). O(1); lets the
        scheduler wait without scoring a choice that cannot go
        (`bench.instructions`)."""
        memo = self._no_room
        if memo is None:
            return True
        if endpoints is not memo[0] or priority != memo[1]:
            return True
        return self._pool().version != self._version or self._clock() - memo[2] > self._blind_after

    def with_room(self, endpoints: Sequence[E], priority: int = 0) -> list[E]:
        """The `endpoints` (anything with an `address`) with room for band
        `priority`: `has_room` for each, the snapshot and clock read once.
        (The scheduler asks it when its choice had no room, often of a full
        pool, so a band below the top is checked in one loop, `_check`'s
        rules written out.)"""
        pool = self._pool()
        if pool.version != self._version:
            self._observe(pool)
        now = self._clock()
        band = self._bands.get(priority)
        if band is None:
            self._learn_band(priority)
            band = self._bands[priority]
        ceiling, top, _ = band
        if top or self.usage.dynamic:
            check = self._check
            return [endpoint for endpoint in endpoints if check(endpoint.address, priority, now)]
        estimators = self._estimators
        in_flight = self._in_flight
        blind_after = self._blind_after
        blind_limit = self.blind_limit
        blocked = self.blocked
        kept = []
        oldest = inf  # the oldest sample read (-inf: some endpoint has none fresh)
        for endpoint in endpoints:
            address = endpoint.address
            estimator = estimators.get(address)
            held = in_flight.get(address, 0)
            seen = estimator.seen if estimator is not None else None
            if seen is None or now - seen > blind_after or estimator.too_fast_to_see:
                if blind_limit <= 0 or held < blind_limit:
                    kept.append(endpoint)
                oldest = -inf  # any completion may free one of its fixed slots
                continue
            if seen < oldest:
                oldest = seen
            if fits(estimator, held, ceiling):
                kept.append(endpoint)
            else:
                blocked.add(address)
        if not kept:
            self._no_room = (endpoints, priority, oldest)
        return kept

    def _check(self, endpoint: str, priority: int, now: float) -> bool:
        estimator = self._estimators.get(endpoint)
        if (
            estimator is None
            or estimator.seen is None
            or now - estimator.seen > self._blind_after
            or estimator.too_fast_to_see
        ):
            # No recent sample to learn from, or none that could see the
            # requests: the fixed limit, if any.
            blind = self.blind_limit
            return blind <= 0 or self._in_flight.get(endpoint, 0) < blind
        band = self._bands.get(priority)
        if band is None:
            self._learn_band(priority)
            band = self._bands[priority]
        ceiling, top, rank = band
        in_flight = self._in_flight.get(endpoint, 0)
        limit = estimator.limit
        if self.usage.dynamic:
            priorities = self._priorities
            ceiling = self.usage.ceiling(rank, len(priorities), priorities, in_flight / limit)
        if not top:
            if fits(estimator, in_flight, ceiling):
                return True
            # Demand the limit holds back (a top-band request waits for a
            # known slot, so it says nothing about whether there are more).
            self.blocked.add(endpoint)
            return False
        if estimator.pending >= max(estimator.budget, self._pending + 1):
            return False
        if estimator.probing:
            # One beyond the limit, to see whether the server runs it. A
            # top-band request takes it only while the size is unknown and
            # the server took everything it was sent; else it would wait at
            # a full server.
            if in_flight >= (limit if estimator.found or estimator.queue else limit + 1):
                return False
        elif in_flight >= allowed(limit, ceiling):
            return False
        if estimator.slowed and not self._all_slowed:
            # It waits less in the EPP for a slot at a server that did not
            # slow down (the top band is the first to get it) than it would
            # be served here.
            return False
        if estimator.pending or (estimator.probing and estimator.found):
            return not self._idle_room(now)
        return True

    def _reopen(self, endpoint: str, estimator: LimitEstimator | None) -> None:
        """`endpoint` freed a slot or a pending place: forget `_no_room` if
        it may now take a request of that band (remembering it in
        `_reopened` when this endpoint alone did)."""
        memo = self._no_room
        if memo is None:
            reopened = self._reopened
            if reopened is None or reopened[1] == endpoint:
                return
            memo = reopened[0]
        band = self._bands.get(memo[1])
        if (
            estimator is None
            or band is None
            or fits(estimator, self._in_flight.get(endpoint, 0), band[0])
        ):
            self._reopened = (memo, endpoint) if self._no_room is not None else None
            self._no_room = None

    def _took_room(self, endpoint: str, estimator: LimitEstimator) -> None:
        """A request went to `endpoint`: if it alone had made room since
        `_no_room` was forgotten and has none left, that holds again."""
        memo, opened = self._reopened
        self._reopened = None
        if endpoint != opened:
            return
        band = self._bands.get(memo[1])
        if band is not None and not fits(estimator, self._in_flight.get(endpoint, 0), band[0]):
            self._no_room = memo

    def _idle_room(self, now: float) -> bool:
        """Whether some endpoint has room for the top band, nothing pending
        and no probe under way."""
        key = (self._version, self._changes)
        if self._idle_key != key:
            self._idle_key = key
            self._idle = False
            top = self._priorities[0]
            for address, estimator in self._estimators.items():
                if estimator.pending or (estimator.probing and estimator.found):
                    continue
                if self._check(address, top, now):
                    self._idle = True
                    break
        return self._idle

    def in_flight_at(self, endpoint: str) -> int:
        return self._in_flight.get(endpoint, 0)

    # -- what it learned ---------------------------------------------------------

    def limit_of(self, endpoint: str) -> int:
        """The learned limit of `endpoint` (the initial one when not seen yet)."""
        estimator = self._estimators.get(endpoint)
        return estimator.limit if estimator is not None else self.settings.initial

    def saturation(self) -> float:
        """The pool's saturation as this gate sees it: requests in flight
        over the sum of the pool's learned limits (1.0: every credit used)."""
        total = sum(self.limit_of(endpoint.address) for endpoint in self._pool().endpoints)
        return self.in_flight / total if total else 1.0

    def limits(self) -> dict[str, int]:
        """Every known endpoint's learned limit."""
        return {address: e.limit for address, e in self._estimators.items()}

    def adjustments(self) -> dict[str, int]:
        """How often each known endpoint's limit changed."""
        return {address: e.adjustments for address, e in self._estimators.items()}

    def headroom_of(self, endpoint: str) -> int:
        """The slots of `endpoint` that only the top band may use."""
        limit = self.limit_of(endpoint)
        lowest = min((band[0] for band in self._bands.values()), default=1.0)
        return limit - allowed(limit, lowest)

    # -- internals -----------------------------------------------------------------

    def _learn_band(self, priority: int) -> None:
        """Add a band: every band's (static ceiling, whether it is the top
        band of several, rank). A policy whose ceilings move with saturation
        is asked per request instead."""
        self._no_room = self._reopened = None
        priorities = self._priorities
        priorities.append(priority)
        priorities.sort(reverse=True)
        usage = self.usage
        count = len(priorities)
        self._bands = {
            p: (
                1.0 if usage.dynamic else usage.ceiling(rank, count, priorities, 0.0),
                rank == 0 and count > 1,
                rank,
            )
            for rank, p in enumerate(priorities)
        }

    def _observe(self, pool: Observations) -> None:
        self._version = pool.version
        self._no_room = self._reopened = None
        estimators = self._estimators
        present = set()
        blocked = self.blocked
        probes = max(1, int(len(pool.endpoints) * PROBE_SHARE))
        probing = sum(1 for e in estimators.values() if e.probing and e.found)
        for endpoint in pool.endpoints:
            address = endpoint.address
            present.add(address)
            estimator = estimators.get(address)
            if estimator is None:
                estimator = estimators[address] = LimitEstimator(self.settings)
            was = estimator.probing and estimator.found
            may_probe = probing < probes
            if estimator.observe(endpoint.metrics, address in blocked, may_probe) is not None:
                blocked.discard(address)
                probing += (estimator.probing and estimator.found) - was
        if len(estimators) > len(present):
            for address in [a for a in estimators if a not in present]:
                del estimators[address]
                blocked.discard(address)
        self._compare_latencies(self._clock())

    def _compare_latencies(self, now: float) -> None:
        """Compare each endpoint's recent latency to the median of the
        others' (`LimitEstimator.compare`): a pool of different servers, or
        a load that slows every server alike, changes no comparison, and
        none depends on when a reference was taken. O(E log E), once per
        snapshot."""
        rated = sorted(
            (estimator.itl, index, estimator)
            for index, estimator in enumerate(self._estimators.values())
            if estimator.found and estimator.latency_known()
        )
        if len(rated) >= 2:
            latencies = [itl for itl, _, _ in rated]
            for position, (itl, _, estimator) in enumerate(rated):
                estimator.compare(itl / median_without(latencies, position), now)
        self._all_slowed = all(estimator.slowed for estimator in self._estimators.values())
