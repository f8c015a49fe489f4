"""The gate: each endpoint's credits (what it holds) against its
estimator's limit and pending budget, the bands' shares of it, and the
memo that lets the scheduler skip a pool with no room."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from math import inf
from typing import TypeVar

from epp.flowcontrol.adaptive.estimator import (
    STEP_ARRIVALS,
    LimitEstimator,
    allowed,
    end_step,
    fits,
    has_burst_room,
    room,
    step_passed,
)
from epp.flowcontrol.adaptive.inputs import AdaptiveLimits, Observations, Observed
from epp.flowcontrol.adaptive.latency import compare_to_pool
from epp.flowcontrol.gate import count_out
from epp.flowcontrol.request import ADOPTED_SEQ, FlowRequest, State
from epp.flowcontrol.usagelimits import DEFAULT_USAGE_LIMITS, UsageLimitPolicy

PROBE_SHARE = 0.25
"""At most this share of the pool's endpoints (at least one) probe a known
size at once. While an endpoint probes, bands below the top may fill it to
one past its limit, its headroom included, and they hold those slots until
their requests end: were every endpoint to probe at once, as endpoints
found full together would, a top-band arrival would find no slot anywhere."""

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
        "_found_sizes",
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
        self._found_sizes: set[int] = set()
        """The limits at which endpoints of the pool were found full (at
        the last snapshot): a top-band request takes no probe slot at one."""
        self._idle_key: tuple[int | None, int] | None = None
        self._idle = False
        self._no_room: tuple[object, int, float] | None = None
        """(endpoints, priority, oldest): `with_room` found none of these
        endpoints with room for that band, and nothing that could make room
        happened since; `oldest` is the oldest of their samples, whose
        staleness would (`may_have_room`), or earlier if the step of a burst
        that held one back ends sooner (by `oldest + blind_after`)."""
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
            now = self._clock()
            if estimator is None:
                estimator = self._estimators[endpoint] = LimitEstimator(self.settings, now)
            # An adopted request already runs there (a new decider's
            # rebuild): not pending, not part of a burst, and its completion
            # before the next sample no sign of a server too fast to see.
            if request.seq != ADOPTED_SEQ:
                if not estimator.burst or step_passed(estimator, now):
                    # A step ended since the burst began (heard, or a mean
                    # step passed with little pending): this one starts the
                    # next, which lasts a mean step (with none measured yet,
                    # until a step end is heard).
                    estimator.burst = 0
                    step = estimator.latency.mean_itl
                    estimator.burst_until = now + step if step > 0.0 else inf
                estimator.pending += 1
                estimator.burst += 1
                estimator.sent += 1
                estimator.sent_at.append(now)
                if request.seq > estimator.sent_seq:
                    estimator.sent_seq = request.seq
            if self._reopened is not None:
                self._took_room(endpoint, estimator)

    def on_complete(self, request: FlowRequest) -> None:
        self._changes += 1
        self.in_flight -= 1
        endpoint = request.endpoint
        if endpoint is not None:
            count_out(self._in_flight, endpoint)
            estimator = self._estimators.get(endpoint)
            if estimator is not None:
                estimator.done += 1
                estimator.done_at.append(self._clock())
                if request.seq > estimator.seen_seq:
                    # Sent after the last sample, so counted as pending
                    # unless its first token came: done, it is not waiting.
                    estimator.done_unseen += 1
                    if estimator.pending and not request.running:
                        estimator.pending -= 1
                end_step(estimator)
            if self._no_room is not None or self._reopened is not None:
                self._reopen(endpoint, estimator)

    def observe_latency(self, request: FlowRequest, itl: float) -> None:
        """`request`'s streamed response ended with `itl` seconds per output
        token after the first (the shell measures it on the response)."""
        endpoint = request.endpoint
        estimator = self._estimators.get(endpoint) if endpoint is not None else None
        # A server's own histogram says it at every sample, and a response's
        # mean is then not used: the call spared (bench.instructions).
        if estimator is not None and itl > 0.0 and not estimator.latency.server_itl:
            estimator.latency.observe_response(itl)

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
        if estimator is None:
            return False
        burst = not has_burst_room(estimator, self._clock())
        counted = estimator.pending and request.seq > estimator.seen_seq
        if counted:
            estimator.pending -= 1
        end_step(estimator)
        if not counted and not burst:
            return False
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
        does not hold back, no first token, no new band, no sample turned
        stale (then the fixed limit applies) and no step ended that held a
        burst back. O(1); lets the
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
        opens = inf
        for endpoint in endpoints:
            address = endpoint.address
            estimator = estimators.get(address)
            held = in_flight.get(address, 0)
            seen = estimator.fresh_at if estimator is not None else None
            if seen is None or now - seen > blind_after or estimator.too_fast_to_see:
                if blind_limit <= 0 or held < blind_limit:
                    kept.append(endpoint)
                oldest = -inf  # any completion may free one of its fixed slots
                continue
            if seen < oldest:
                oldest = seen
            if fits(estimator, held, ceiling, now):
                kept.append(endpoint)
            else:
                blocked.add(address)
                if estimator.burst >= STEP_ARRIVALS and estimator.burst_until < opens:
                    opens = estimator.burst_until
        if not kept:
            # A burst's step ends by `opens`: as a sample turning stale would,
            # that may make room.
            self._no_room = (endpoints, priority, min(oldest, opens - blind_after))
        return kept

    def _check(self, endpoint: str, priority: int, now: float) -> bool:
        estimator = self._estimators.get(endpoint)
        if (
            estimator is None
            or now - estimator.fresh_at > self._blind_after
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
        limit = room(estimator)
        if self.usage.dynamic:
            priorities = self._priorities
            ceiling = self.usage.ceiling(rank, len(priorities), priorities, in_flight / limit)
        if not top:
            if fits(estimator, in_flight, ceiling, now):
                return True
            # Demand the limit holds back (a top-band request waits for a
            # known slot, so it says nothing about whether there are more).
            self.blocked.add(endpoint)
            return False
        if estimator.pending >= max(estimator.budget, self._pending + 1) or not has_burst_room(
            estimator, now
        ):
            return False
        if estimator.probing:
            # One beyond the limit, to see whether the server runs it. A
            # top-band request takes it only while the size is unknown, the
            # server took everything it was sent, and no endpoint of the pool
            # was found full at this size (one like it is full here too); else
            # it would wait at a full server for a completion, where the EPP
            # gives it the first slot the pool frees.
            if in_flight >= (
                limit
                if estimator.found or estimator.queue or estimator.limit in self._found_sizes
                else limit + 1
            ):
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
            or fits(estimator, self._in_flight.get(endpoint, 0), band[0], self._clock())
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
        if band is not None and not fits(
            estimator, self._in_flight.get(endpoint, 0), band[0], self._clock()
        ):
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

    def seed(self, limits: Mapping[str, int]) -> None:
        """Start each endpoint of `limits` from the limit given (one another
        decider of the pool learned) instead of `initial`; what it learns
        from here moves it as usual."""
        self._no_room = self._reopened = None
        now = self._clock()
        for address, limit in limits.items():
            estimator = self._estimators.get(address)
            if estimator is None:
                estimator = self._estimators[address] = LimitEstimator(self.settings, now)
            estimator.start_from(limit)

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
        now = self._clock()
        probes = max(1, int(len(pool.endpoints) * PROBE_SHARE))
        probing = sum(1 for e in estimators.values() if e.probing and e.found)
        for endpoint in pool.endpoints:
            address = endpoint.address
            present.add(address)
            estimator = estimators.get(address)
            if estimator is None:
                estimator = estimators[address] = LimitEstimator(self.settings, now)
            was = estimator.probing and estimator.found
            may_probe = probing < probes
            held = self._in_flight.get(address, 0)
            if estimator.observe(endpoint.metrics, address in blocked, may_probe, held) is not None:
                blocked.discard(address)
                probing += (estimator.probing and estimator.found) - was
        if len(estimators) > len(present):
            for address in [a for a in estimators if a not in present]:
                del estimators[address]
                blocked.discard(address)
        self._found_sizes = {e.limit for e in estimators.values() if e.found}
        compare_to_pool(estimators.values(), now)
        self._all_slowed = all(estimator.slowed for estimator in estimators.values())
