"""The estimator: one endpoint's limit and pending budget, learned from its
server's samples (the package README states the law), and the room check a
band below the top applies with them (`fits`)."""

from __future__ import annotations

from collections import deque
from math import ceil, exp, inf

from epp.flowcontrol.adaptive.inputs import AdaptiveLimits, Sample
from epp.flowcontrol.adaptive.latency import LatencySignal

SHRINK = 0.9
"""A server must run fewer than this share of its limit to lower it (the
KV-cache's capacity moves with the request mix; the pending budget, not
the limit, keeps the queue short)."""


class LimitEstimator:
    """One endpoint's learned in-flight limit (the package README's law).

    `limit` >= 1 always: the most requests the server has been seen running
    at once, lowered when it keeps a queue while running fewer. `probing`:
    whether the gate lets one more through to find out whether the server
    runs more (from the start until the server is first seen full, then every
    `probe_interval` until it is refused). `pending`: requests sent there
    that no sample has shown running yet. `adjustments` counts the limit's
    changes; `seen` is the timestamp of the last sample used; `latency`,
    its latency signal.
    """

    __slots__ = (
        "adjustments",
        "admitting",
        "budget",
        "burst",
        "burst_until",
        "crowded",
        "done",
        "done_at",
        "done_unseen",
        "factor",
        "found",
        "fresh_at",
        "kv_bound",
        "latency",
        "limit",
        "most",
        "pending",
        "probe_since",
        "probing",
        "queue",
        "queued",
        "running",
        "samples",
        "seen",
        "seen_seq",
        "sent",
        "sent_at",
        "sent_before",
        "sent_seq",
        "settings",
        "slowed",
        "steps_at",
        "too_fast_to_see",
        "window_end",
    )

    def __init__(self, settings: AdaptiveLimits, now: float = 0.0) -> None:
        self.settings = settings
        self.start_from(settings.initial)
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
        self.sent_at: deque[float] = deque(maxlen=settings.maximum)
        """When the requests sent here since the last sample's read went
        (the gate's clock): the sample cannot show them."""
        self.done_at: deque[float] = deque(maxlen=settings.maximum)
        """When the requests that ended here since the last sample's read
        ended (the gate's clock): the sample may still count them running."""
        self.sent_seq = 0
        """The newest (by the core's sequence number) request sent here."""
        self.seen_seq = 0
        """`sent_seq` when the last sample was used: requests after it are
        the ones counted as pending."""
        self.queue = 0
        """The server's queue at the last sample."""
        self.kv_bound = False
        """Whether its last refusal came with its KV cache full (`KV_FULL`):
        blocks, not sequences, bound its batch, so one more request may wait
        there for the blocks its completions free (`room`)."""
        self.steps_at = -1.0
        """Its latency histogram's count at the last sample (-1: none yet):
        when the next one shows it moved, a decode step ended between."""
        self.seen: float | None = None
        self.fresh_at = now
        """When its newest news is from: the last sample used, or (none yet)
        when the gate first saw the endpoint (`now`). Older than
        `blind_after`, the samples cannot be learned from."""
        self.adjustments = 0
        self.budget = settings.pending
        """Requests it may have pending until the next sample (`_budget`)."""
        self.burst = 0
        """Requests sent here within its current step: since the step end
        the EPP last heard of (a completion, a first token), or since the
        first of them if a mean step (its histogram's) passed since, each
        counted as an end only once fewer than `STEP_ARRIVALS` were left
        pending (`end_step`); at a sample, what it holds that the sample
        could not show (what was on its way at the read, in a step a mean
        step from the read ends). At most `STEP_ARRIVALS`
        (`has_burst_room`)."""
        self.burst_until = 0.0
        """When the step the burst was sent in ends, at the latest (its
        first request's dispatch plus a mean step)."""
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
        self.latency = LatencySignal()
        self.slowed = False
        """Its latency grew more than the pool's: the limit holds (no probe)."""
        self.factor = 1.0
        self.admitting = 0.0
        """About the share of its recent steps that admitted a request: what
        it took per sampling interval times its mean step over the interval,
        averaged over about `window` (near 1: every step prefills)."""
        """How much more its latency grew than the pool's, at the last comparison."""

    def start_from(self, limit: int) -> None:
        """Set the limit to `limit`, kept between 1 and the maximum."""
        self.limit = max(1, min(limit, self.settings.maximum))

    def compare(self, relative: float, now: float) -> int:
        """Its recent latency is `relative` times the median of the other
        endpoints' at `now`. Fed to the reference while it runs full at the
        size it was found at, at a healthy speed; once the reference has
        enough seconds, the limit follows how much `relative` grew over it
        (`slow_down`). Returns the change of the limit."""
        if self.admitting >= PREFILLING:
            # Its steps read the prompts it is sent, not how fast it runs.
            return 0
        limit = self.limit
        full = (
            self.found
            and not self.slowed
            and self.factor < self.settings.recovered
            and self.running >= limit * SHRINK
        )
        factor = self.latency.compare(relative, now, full, limit)
        return 0 if factor is None else self.slow_down(factor)

    def slow_down(self, factor: float) -> int:
        """Its latency grew `factor` times more than the pool's since its
        reference: hold its limit at the reference's divided by `factor`
        (never grow it while slowed). Returns the change."""
        settings = self.settings
        self.factor = factor
        if factor >= settings.slower:
            self.slowed = True
            self.probing = False
            target = max(1, int(self.latency.reference_limit / factor))
            if self.limit > target:
                change = target - self.limit
                self.limit = target
                self.adjustments += 1
                return change
        elif (
            self.slowed
            and self.running <= self.limit
            and self.latency.steady <= settings.recovered * self.latency.reference
        ):
            # Judged on the longer average, and only once it runs what its
            # limit lets it: while it drains the batch it held it admits
            # nothing, and a step that prefills nothing is short at any speed.
            self.slowed = False
        return 0

    def observe(
        self, sample: Sample, binding: bool, may_probe: bool = True, held: int = 0
    ) -> int | None:
        """Use `sample` if it is new and was read; `held`, what the
        endpoint holds now; `binding` tells whether
        the limit held a request back since the last sample; `may_probe`,
        whether a server of known size may start a probe now (the pool's
        share of probes is not taken). Returns the change of the limit, or
        None when the sample was not used."""
        now = sample.updated_at
        if sample.failing or now is None or now == self.seen:
            return None
        last = self.seen
        self.seen = self.fresh_at = now
        self.seen_seq = self.sent_seq
        if self.done >= 2:
            self.too_fast_to_see = self.done_unseen * 2 >= self.done
        self.done = self.done_unseen = 0
        running = int(sample.running)
        waiting = int(sample.waiting)
        # (Comparisons rather than min() and max() here and in `_budget`:
        # CPython 3.11 parses keywords at every call of those, and this runs
        # per endpoint per sample: bench.instructions.)
        # What it took since the last sample: its queue then and what it
        # was sent since, less its queue now (admitted or done already).
        took = self.queue + self.sent - waiting
        if took < 0:
            took = 0
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
        self.queue = waiting
        # Pending: its queue, and what was sent after the server was read
        # (the scrape's lag), which neither its queue nor its running count
        # shows. (Only those: an older request not yet running there is in
        # its prefill elsewhere, disaggregated.)
        sent_at = self.sent_at
        between = 0
        while sent_at and sent_at[0] <= now:
            sent_at.popleft()
            between += 1
        unseen = len(sent_at)
        # A server that reports its histogram shows when its steps end. Its
        # queue was refused at a step end only when a request waited through
        # one: a step ended between the two reads, and the queue is longer
        # than what arrived between them (first come, first admitted: one of
        # it was there at the first read). What waits inside one step (a
        # long prefill, or a request that arrived mid-step) was not refused.
        count = sample.itl_count
        stepping = count > 0.0 or bool(sample.itl_bounds)
        stepped = last is not None and count != self.steps_at
        self.steps_at = count
        refused = stepped and waiting > between if stepping else waiting > 0
        if refused:
            self.kv_bound = sample.kv_usage >= KV_FULL
        done_at = self.done_at
        while done_at and done_at[0] <= now:
            done_at.popleft()
        # Or, if more, what it held at the read that the read showed neither
        # running nor waiting (what ended after the read it may show
        # running), up to what it was sent in the interval before: a request
        # still on its way to the server when it was read (the gateway's
        # path).
        on_path = held + len(done_at) - running - waiting
        if on_path > self.sent_before:
            on_path = self.sent_before
        self.pending = waiting + (on_path if on_path > unseen else unseen)
        # What it still holds unseen may share the current step.
        self.burst = self.pending
        self.running = running
        self.latency.observe(sample, now)
        step = self.latency.mean_itl
        if on_path > unseen:
            # Sent before the read, not there at it: they arrive in the step
            # after the read, which a mean step from it ends (the burst they
            # were sent in may have ended long before).
            self.burst_until = now + step if step > 0.0 else inf
        if last is not None and step > 0.0:
            elapsed = now - last
            share = took * step / elapsed
            keep = exp(-elapsed / self.settings.window)
            self.admitting = self.admitting * keep + share * (1.0 - keep)
        # What it is sent during a step waits for the step's end.
        long_steps = last is not None and step >= (now - last) * LONG_STEP
        settings = self.settings
        if self.window_end is None:
            self.window_end = now + settings.window
            self.most = self.queued = self.samples = 0
        window_end = self.window_end
        if stepped or not stepping:
            # Only a sample across a step end says whether the server keeps a
            # queue: within one step, every arrival waits for its end.
            self.samples += 1
            self.queued += waiting > 0
        if running > self.most:
            self.most = running
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
            samples = self.samples
            throughout = samples and self.queued >= samples * QUEUED_THROUGHOUT and self.most < old
            if throughout or (samples and self.queued * 2 >= samples and self.most < old * SHRINK):
                new = max(1, running if throughout and waiting else self.most)
                self.probing = False
                self.found = True
                self.probe_since = now
                self.latency.forget_reference()
            self.window_end = None
        elif self.probing:
            if stepping:
                if refused:
                    # The probe waited through a step end: no room.
                    self.probing = False
                    self.found = True
                    self.probe_since = now
            elif not (binding or waiting):
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
        if new > settings.maximum:
            new = settings.maximum
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
        with no queue (after one with a queue, what it took: never less than
        it admitted over the last delay), and not once a request waited there a whole interval
        (`stale`: `crowded`, until `NOT_FULL`). A server of known size grows so with no queue
        now, one at a time after a stale queue, never past `KEEP_PACE` of its
        limit (near the top, one at a time keeps the server's queue and the
        top band's prefill steps short)."""
        pending = self.settings.pending
        if not self.found:
            base = pending + 1 if limit >= 64 else pending
            if self.crowded:
                return base
            pace = waiting + took if waiting else (INTAKE * took if quiet else took)
            return pace if pace > base else base
        if stale:
            return pending
        pace = waiting + took if waiting else INTAKE * took
        room = int(limit * KEEP_PACE) - running
        return min(max(pending, pace), max(pending, room))


KV_FULL = 0.9
"""A refusal with the server's KV cache at least this full was for blocks,
not for a sequence slot: a cache that holds ten or more of the requests it
runs has no room for another. One that holds fewer may refuse below it,
and is then taken as bound by its sequences (no request waits beyond the
limit there)."""

STEP_ARRIVALS = 2
"""At most this many requests go to an endpoint within one of its steps (up
to a completion or a first token there, which come at a step's end, or for
a mean step, each counted once fewer than this many are pending there). A
server admits its queue at its step boundaries, so what is sent within one
step waits for the next: this bounds the queue whatever the budget."""

PREFILLING = 0.25
"""A server whose steps admitted requests at this share or more is not
judged on its latency: the median of its steps is a decode step only while
fewer than half of them prefill, and the share swings within a window."""

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


def room(estimator: LimitEstimator) -> int:
    """What the endpoint may hold: its limit, one more where its KV cache
    bounds the batch (a request waiting there takes the blocks a completion
    frees at the next step; one sent at the completion would arrive a path
    and a step later). The pending budget still bounds its queue."""
    return estimator.limit + estimator.kv_bound


def has_burst_room(estimator: LimitEstimator, now: float) -> bool:
    """Whether the endpoint may be sent one more within its current step."""
    return estimator.burst < STEP_ARRIVALS or step_passed(estimator, now)


def step_passed(estimator: LimitEstimator, now: float) -> bool:
    """Whether a mean step since the burst began ended its step. Only with
    fewer than `STEP_ARRIVALS` pending: what the server was not yet seen
    taking arrived within a step it cannot tell the end of (a prefill step
    lasts longer than the mean), and shares the next one with whatever is
    sent now."""
    return now >= estimator.burst_until and estimator.pending < STEP_ARRIVALS


def end_step(estimator: LimitEstimator) -> None:
    """A step end was heard there (a completion, a first token): the next
    requests start a new step's count, unless `STEP_ARRIVALS` or more of
    what it was sent are still pending. The news took a path to come, so a
    request sent just before it arrived after that step end; and one
    waiting there for blocks or a slot was not taken at it: either shares
    the next step with whatever is sent now."""
    if estimator.pending < STEP_ARRIVALS:
        estimator.burst = 0


def fits(estimator: LimitEstimator, held: int, ceiling: float, now: float) -> bool:
    """Whether a learned endpoint holding `held` requests has room for a
    band below the top with `ceiling` at `now`: its pending budget is not
    spent, its current step may take one more, and it holds fewer than its
    limit (one more while probing) allows."""
    limit = room(estimator)
    return (estimator.pending < estimator.budget and has_burst_room(estimator, now)) and held < (
        limit + 1 if estimator.probing else allowed(limit, ceiling)
    )
