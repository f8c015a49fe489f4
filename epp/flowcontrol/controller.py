"""The flow controller: the one owner of every queue.

Synchronous and clock-free: every call takes `now` from its caller. The live
shell (`epp.serve.admission`) and the simulator (`epp.sim`) drive the same object.

Dispatch is strict priority. Bands are visited from the highest priority
down; a band dispatches while the gate is open for it and the placer finds an
endpoint; the first closed gate, or a request no endpoint has room for, ends
the pass, so no lower band ever overtakes a waiting higher one. Inside a band
the fairness policy chooses the flow and the flow's ordering its request.

The controller drives itself: every call that can free room dispatches as
much as possible before it returns, and returns the requests it settled
(dispatched with `endpoint` set, or ended with `outcome` set), so no shell
decides when to dispatch:

- `enqueue_and_dispatch` (an arrival; when nothing is queued the request goes
  to its endpoint without entering a queue, leaving the same state),
- `complete`, `cancel`, `reconfigure`,
- `poke(now)`: whatever falls due by `now` (TTL expiries, idle flows) and a
  dispatch pass; a shell calls it when something outside the core changed
  (new metrics, endpoints joining) and at `next_wakeup()`.

`next_wakeup()` is the one time a shell must wake the core: the earliest of
the next TTL deadline (`epp.flowcontrol.deadlines`, exact, no periodic sweep)
and the next idle-flow check.

Two regimes, as the reference's: while the pool has endpoints a queued
request's budget is its effective TTL (its own, capped by its band's); while
it has none (scale from zero) the budget is `no_endpoint_ttl` (capped by the
request's own TTL), it ends `rejected-no-endpoints`, and a full queue rejects
with that reason too. Each change of regime, seen at the next dispatch pass,
starts every queued request's budget afresh, so a request that waited out an
empty pool is not shed the moment an endpoint appears.

`enqueue` and `dispatch` are the two halves of an arrival, kept for
measuring and testing the queue itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from heapq import heappop, heappush
from math import inf

from epp.flowcontrol.band import Band
from epp.flowcontrol.config import FlowControlConfig, effective_ttl
from epp.flowcontrol.deadlines import Deadlines
from epp.flowcontrol.flow import Flow, FlowKey
from epp.flowcontrol.gate import Gate, Placer
from epp.flowcontrol.ordering import order_key
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import ADOPTED_SEQ, FlowRequest, State, Usage

NEW = State.NEW
QUEUED = State.QUEUED
DISPATCHED = State.DISPATCHED
DISPATCHED_OUTCOME = Outcome.DISPATCHED


class FlowController:
    def __init__(
        self,
        config: FlowControlConfig,
        gate: Gate,
        placer: Placer,
        on_flows_collected: Callable[[list[FlowKey]], None] | None = None,
    ) -> None:
        self.gate = gate
        self.placer = placer
        self.on_flows_collected = on_flows_collected
        """Told of the flows `poke` forgot as idle (their keys)."""
        self._apply(config)
        self._bands: dict[int, Band] = {}
        self._bands_desc: list[Band] = []
        self._deadlines = Deadlines()
        self._idle: list[tuple[float, int, Flow]] = []
        self._seq = 0
        self._empty = False
        """The regime: whether the pool had no endpoint at the last look."""
        self._regime_since = -inf
        """When the regime last changed; budgets are charged from then at the earliest."""
        self._closed = False
        self.queued_requests = 0
        self.queued_bytes = 0
        self.in_flight = 0
        for band_config in config.bands:
            self._add_band(band_config.priority, keep=True)

    # -- configuration -----------------------------------------------------

    def reconfigure(self, config: FlowControlConfig, now: float) -> list[FlowRequest]:
        """Apply new limits and band policies; queued requests stay queued.
        Returns what the dispatch pass that follows settled."""
        self._apply(config)
        configured = {b.priority for b in config.bands}
        for priority, band in self._bands.items():
            band.reconfigure(config.band(priority), config.default_ttl)
            band.keep = band.keep or priority in configured
        for priority in configured - self._bands.keys():
            self._add_band(priority, keep=True)
        return self.dispatch(now)

    def _apply(self, config: FlowControlConfig) -> None:
        self.config = config
        self._no_endpoint_ttl = effective_ttl(config.empty_pool_ttl)
        self._max_requests = config.max_requests or inf
        self._max_bytes = config.max_bytes or inf
        self._global_limits = bool(config.max_requests or config.max_bytes)

    def ensure_bands(self, priorities: Iterable[int]) -> None:
        """Make sure these bands exist (the priorities of the known objectives)."""
        for priority in priorities:
            band = self._bands.get(priority)
            if band is None:
                self._add_band(priority, keep=True)
            else:
                band.keep = True

    def _add_band(self, priority: int, keep: bool) -> Band:
        band = self._bands[priority] = Band(
            self.config.band(priority), self.config.default_ttl, keep, self._deadlines.new_lane()
        )
        self._bands_desc = sorted(self._bands.values(), key=lambda b: -b.priority)
        return band

    # -- the request's life ------------------------------------------------

    def enqueue(self, request: FlowRequest, now: float) -> Outcome | None:
        """Queue `request`. Returns None when queued, or the outcome that ended
        it at once (capacity reached, shutting down)."""
        if request.state is not NEW:
            raise ValueError(f"request {request.request_id} was already enqueued")
        if self._closed:
            return self._drop_new(request, Outcome.REJECTED_SHUTTING_DOWN)
        band = self._bands.get(request.priority) or self._add_band(request.priority, keep=False)
        size = request.byte_size
        if self._over_capacity(band, size):
            if not band.flows and not band.keep:
                self._remove_band(band)
            return self._drop_new(
                request,
                Outcome.REJECTED_NO_ENDPOINTS if self._empty else Outcome.REJECTED_SATURATED,
            )

        ttl = self._stamp(request, band)
        if self._empty or request.arrival < self._regime_since:
            self._track(request, band)
        elif ttl is not None:  # `_track` for a pool with endpoints, inlined (bench.queue_core)
            self._deadlines.track(
                request, band.lane if ttl == band.ttl else None, self.queued_requests
            )
        flow = request.flow
        request.state = QUEUED
        flow.count += 1
        band.count += 1
        band.bytes += size
        self.queued_requests += 1
        self.queued_bytes += size
        band.policy.push(request, flow)
        return None

    def _stamp(self, request: FlowRequest, band: Band) -> float | None:
        """Set the fields the core gives a request arriving in `band`: its
        sequence number, deadline (arrival + effective TTL: the smallest of
        its own and the band's), order key and flow. Returns the effective TTL
        (None: none)."""
        request.seq = self._seq = self._seq + 1
        ttl = request.ttl
        if ttl is None or ttl <= 0 or (band.ttl is not None and band.ttl < ttl):
            ttl = band.ttl
        if ttl is not None:
            request.deadline = request.arrival + ttl
        if not band.fcfs:
            request.order_key = order_key(band.config.ordering, request)
        request.flow = band.flows.get(request.fairness_id) or band.flow(request.fairness_id)
        return ttl

    def _track(self, request: FlowRequest, band: Band) -> None:
        """Track the queued `request`'s expiry under the current regime (see
        the module docstring); its band's lane when it takes the band's
        budget, in arrival order."""
        own = request.ttl if request.ttl is not None and request.ttl > 0 else None
        shared = self._no_endpoint_ttl if self._empty else band.ttl
        if own is not None and (shared is None or own < shared):
            lane, budget = None, own
        elif shared is not None:
            lane, budget = band.lane, shared
        else:
            return
        start = request.arrival
        if start < self._regime_since:
            start = self._regime_since
        request.deadline = start + budget
        self._deadlines.track(request, lane, self.queued_requests)

    def _observe_regime(self, now: float) -> None:
        """Look whether the pool has endpoints; on a change of regime every
        queued request's budget starts again from `now`."""
        empty = not self.placer.has_endpoints()
        if empty is self._empty:
            return
        self._empty = empty
        self._regime_since = now
        self._deadlines.clear()
        queued = sorted(
            (request for band in self._bands_desc for request in band.policy.requests()),
            key=lambda request: request.seq,
        )
        for request in queued:
            self._track(request, request.flow.band)

    def _over_capacity(self, band: Band, size: int) -> bool:
        """Would one more request of `size` bytes overflow `band` or the global limits?"""
        return (
            band.count >= band.max_requests
            or band.bytes + size > band.max_bytes
            or (
                self._global_limits
                and (
                    self.queued_requests >= self._max_requests
                    or self.queued_bytes + size > self._max_bytes
                )
            )
        )

    def enqueue_and_dispatch(
        self, request: FlowRequest, now: float
    ) -> tuple[Outcome | None, list[FlowRequest]]:
        """`enqueue`, then `dispatch` when queued: the same outcomes, counters,
        fairness state and gate and placer calls, in one call. Returns
        enqueue's outcome and dispatch's requests (none when rejected).

        When nothing at all is queued, the pass would see this request alone,
        so it goes to its endpoint without entering its flow's queue, the
        fairness structure or a deadline lane: the common case at light load.
        The placer then sees it before it is queued (fields the core owns not
        yet set)."""
        band = self._bands.get(request.priority)
        size = request.byte_size
        if (
            self.queued_requests
            or band is None
            or self._closed
            or request.state is not NEW
            or self._over_capacity(band, size)
        ):
            outcome = self.enqueue(request, now)
            return outcome, ([] if outcome is not None else self.dispatch(now))
        if not self.gate.is_open(band.priority):
            self.enqueue(request, now)  # the pass would stop at this request
            return None, []
        placement = self.placer.place(request)
        if placement.__class__ is not str:
            if placement is None:
                self._observe_regime(now)  # as the pass would, before it waits
            self.enqueue(request, now)
            band.policy.peek(now)  # what the pass would have dropped on its way
            if placement is None:
                return None, []
            self._remove(request, placement, now)
            return None, [request]
        # `enqueue` and `dispatch`'s bookkeeping, less what cancels out
        self._stamp(request, band)
        flow = request.flow
        band.policy.take_arrival(request, flow)
        self._dispatched(request, flow, placement)
        return None, [request]

    def adopt(self, request: FlowRequest, endpoint: str, now: float) -> None:
        """Hold `request`, new here but already running at `endpoint` (placed
        by another decider before this one took over): its band, flow and
        credit as its dispatch would have left them, without a fairness
        charge (`complete` then corrects the flow's charge to the usage)."""
        if request.state is not NEW:
            raise ValueError(f"request {request.request_id} was already enqueued")
        band = self._bands.get(request.priority) or self._add_band(request.priority, keep=False)
        self._stamp(request, band)
        request.seq = ADOPTED_SEQ
        self._dispatched(request, request.flow, endpoint)

    def dispatch(self, now: float) -> list[FlowRequest]:
        """Dispatch everything the gate and the placer allow now, highest band
        first. Returns the requests that left their queue: dispatched (with
        `endpoint` set), or ended by the placer (outcome set)."""
        done: list[FlowRequest] = []
        if not self.queued_requests:
            return done
        gate = self.gate
        placer = self.placer
        if placer.has_endpoints() is self._empty:  # the regime changed
            self._observe_regime(now)
        for band in self._bands_desc:
            if not band.count:
                continue
            priority = band.priority
            policy = band.policy
            while band.count:
                if not gate.is_open(priority):
                    return done
                request = policy.peek(now)
                placement = placer.place(request)
                if placement.__class__ is not str:
                    if placement is None:
                        return done
                    self._remove(request, placement, now)
                    done.append(request)
                    continue
                # The request leaves its queue (the counts `_remove` takes
                # back, and the policy's `take`), then `_dispatched`,
                # inlined: this is the pass's inner loop, where a call per
                # request is a large share of the cost (bench.queue_core).
                flow = request.flow
                size = request.byte_size
                flow.count -= 1
                band.count -= 1
                band.bytes -= size
                self.queued_requests -= 1
                self.queued_bytes -= size
                policy.take(request, flow)
                request.state = DISPATCHED
                request.outcome = DISPATCHED_OUTCOME
                request.endpoint = placement
                flow.in_flight += 1
                self.in_flight += 1
                gate.on_dispatch(request)
                done.append(request)
        return done

    def complete(
        self, request: FlowRequest, now: float, usage: Usage | None = None
    ) -> list[FlowRequest]:
        """`request`, dispatched, is finished: its endpoint credit returns,
        its fairness charge is corrected to the real `usage` (None: not
        reported, the estimate stands), and the room it
        freed is dispatched. Returns what that pass settled; nothing (and
        nothing changes) when `request` was not in flight."""
        if request.state is not DISPATCHED:
            return []
        request.state = State.COMPLETED
        flow: Flow = request.flow
        flow.band.policy.on_complete(request, flow, usage, now)
        flow.in_flight -= 1
        self.in_flight -= 1
        self.gate.on_complete(request)
        if not flow.count and not flow.in_flight:  # spares the call while the flow is busy
            self._note_if_idle(flow, now)
        return self.dispatch(now) if self.queued_requests else []

    def cancel(self, request: FlowRequest, now: float) -> list[FlowRequest]:
        """Remove a queued request (its client went away) and dispatch what its
        leaving lets through. Returns `request` (outcome CANCELLED) then what
        the pass settled; nothing when it was not queued (already dispatched
        or ended)."""
        if request.state is not QUEUED:
            return []
        self._remove(request, Outcome.CANCELLED, now)
        return [request, *self.dispatch(now)]

    def expire(self, now: float) -> list[FlowRequest]:
        """End every queued request whose deadline is at or before `now`, then
        dispatch. Returns the expired requests, then what the pass settled."""
        expired = self._expire_due(now)
        expired.extend(self.dispatch(now))
        return expired

    def poke(self, now: float) -> list[FlowRequest]:
        """Do what is due by `now` and dispatch as much as possible: end the
        requests whose TTL has passed, forget idle flows (told to
        `on_flows_collected`), then one dispatch pass. Call it when something
        outside the core may have freed room (metrics, endpoints) and at
        `next_wakeup()`. Returns the expired requests, then what the pass
        settled."""
        settled = self._expire_due(now) if self.queued_requests else []
        if self._idle and self._idle[0][0] <= now:
            collected = self._collect_idle(now)
            if collected and self.on_flows_collected is not None:
                self.on_flows_collected(collected)
        settled.extend(self.dispatch(now))
        return settled

    def next_wakeup(self) -> float | None:
        """When `poke` next has something to do by itself (a TTL deadline, an
        idle-flow check), or None."""
        deadline = self._deadlines.next() if self.queued_requests else None
        idle = self._idle[0][0] if self._idle else None
        if deadline is None:
            return idle
        return deadline if idle is None or deadline < idle else idle

    def next_deadline(self) -> float | None:
        """When the next queued request expires, or None."""
        return self._deadlines.next()

    def _expire_due(self, now: float) -> list[FlowRequest]:
        self._observe_regime(now)
        outcome = Outcome.REJECTED_NO_ENDPOINTS if self._empty else Outcome.REJECTED_TTL_EXPIRED
        expired = self._deadlines.pop_due(now)
        for request in expired:
            self._remove(request, outcome, now)
        return expired

    def close(self) -> None:
        """Admit nothing more: every later enqueue is rejected-shutting-down."""
        self._closed = True

    def drain(self, outcome: Outcome, now: float) -> list[FlowRequest]:
        """End every queued request with `outcome` (at shutdown)."""
        ended = [r for band in self._bands_desc for r in band.policy.requests()]
        for request in ended:
            self._remove(request, outcome, now)
        return ended

    # -- idle flows ----------------------------------------------------------

    def _collect_idle(self, now: float) -> list[FlowKey]:
        """Forget flows idle (nothing queued or in flight) for at least the
        configured idle time, and bands that were neither configured nor
        announced once their last flow is gone. Returns the forgotten flows."""
        timeout = self.config.flow_idle_timeout
        heap = self._idle
        collected: list[FlowKey] = []
        while heap and heap[0][0] <= now:
            _, _, flow = heappop(heap)
            idle_since = flow.idle_since
            if not flow.is_idle:
                flow.idle_since = None
            elif idle_since + timeout > now:
                self._seq += 1
                heappush(heap, (idle_since + timeout, self._seq, flow))
            else:
                flow.idle_since = None
                band = flow.band
                if band.flows.get(flow.fairness_id) is not flow:
                    continue
                del band.flows[flow.fairness_id]
                collected.append(flow.key)
                if not band.flows and not band.keep:
                    self._remove_band(band)
        return collected

    # -- statistics ------------------------------------------------------------

    @property
    def priorities(self) -> list[int]:
        """The bands, highest priority first."""
        return [band.priority for band in self._bands_desc]

    def band(self, priority: int) -> Band | None:
        return self._bands.get(priority)

    def bands(self) -> list[Band]:
        return list(self._bands_desc)

    # -- internals ---------------------------------------------------------------

    def _remove_band(self, band: Band) -> None:
        del self._bands[band.priority]
        self._bands_desc = [kept for kept in self._bands_desc if kept is not band]
        self._deadlines.drop_lane(band.lane)

    def _dispatched(self, request: FlowRequest, flow: Flow, placement: str) -> None:
        """The bookkeeping of a dispatch, once `request` is out of its queue
        (or never entered one): its outcome and endpoint, the in-flight
        counts, and the gate told. `dispatch` runs an inlined copy."""
        request.state = DISPATCHED
        request.outcome = DISPATCHED_OUTCOME
        request.endpoint = placement
        flow.in_flight += 1
        self.in_flight += 1
        self.gate.on_dispatch(request)

    def _drop_new(self, request: FlowRequest, outcome: Outcome) -> Outcome:
        request.state = State.DROPPED
        request.outcome = outcome
        return outcome

    def _remove(self, request: FlowRequest, outcome: Outcome, now: float) -> None:
        flow: Flow = request.flow
        band = flow.band
        size = request.byte_size
        request.state = State.DROPPED
        request.outcome = outcome
        flow.count -= 1
        band.count -= 1
        band.bytes -= size
        self.queued_requests -= 1
        self.queued_bytes -= size
        band.policy.discard(request, flow)
        self._note_if_idle(flow, now)

    def _note_if_idle(self, flow: Flow, now: float) -> None:
        if flow.count or flow.in_flight:
            return
        if flow.idle_since is None:
            self._seq += 1
            heappush(self._idle, (now + self.config.flow_idle_timeout, self._seq, flow))
        flow.idle_since = now
