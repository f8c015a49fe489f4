"""The live shell's asyncio adapter over the flow-control core.

`admit` queues a request and returns its outcome when it is dispatched or
ended; it is `offer` (decides at once if it can) then `wait`, for callers
that would rather not start a task for a request that need not wait.
Everything that can free room (an enqueue, a completion, a gate change
announced through `poke`, an expired TTL) runs a dispatch pass at once: there
is no polling tick, so a backlog drains as fast as the pool takes it.

A request dispatched in the pass that its own `admit` started returns without
waiting for anything; only requests that really queue create a future.
Cancelling the task that awaits `admit` (or calling `withdraw`) removes a
queued request at once, or hands back the endpoint credit of a request
dispatched a moment earlier.

TTL expiry is a timer set for the exact next deadline: a newly queued request
with an earlier deadline re-arms it, and when it fires it expires what is due
and re-arms for the next deadline. Idle flows are collected by a timer of
their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from math import inf

from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import Evictor
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State

OutcomeListener = Callable[[FlowRequest, float], None]
"""Told of every admitted request's outcome, with the time it was decided.
(`on_complete` is told when a dispatched request gives its endpoint back,
whichever path completed it, so that the two together count what runs;
`on_queued` when `offer` leaves a request waiting in a queue.)"""


class AdmissionController:
    def __init__(
        self,
        core: FlowController,
        clock: Callable[[], float] = time.monotonic,
        on_outcome: OutcomeListener | None = None,
        on_flows_collected: Callable[[list[FlowKey]], None] | None = None,
        on_complete: Callable[[FlowRequest], None] | None = None,
        on_queued: Callable[[FlowRequest], None] | None = None,
        evictor: Evictor | None = None,
        on_evict: Callable[[FlowRequest], None] | None = None,
    ) -> None:
        self.core = core
        self.evictor = evictor
        self._on_evict = on_evict
        """Ends an evicted request's stream (which then completes it)."""
        self._clock = clock
        self._on_outcome = on_outcome
        self._on_complete = on_complete
        self._on_flows_collected = on_flows_collected
        self._on_queued = on_queued
        self._waiters: dict[FlowRequest, asyncio.Future[Outcome]] = {}
        self._ttl_timer: asyncio.TimerHandle | None = None
        self._ttl_timer_at = inf
        self._idle_timer: asyncio.TimerHandle | None = None
        self._drained = asyncio.Event()
        self._closing = False

    @property
    def queued(self) -> int:
        return self.core.queued_requests

    @property
    def in_flight(self) -> int:
        return self.core.in_flight

    async def admit(self, request: FlowRequest) -> Outcome:
        """Queue `request` and return its outcome. When it is DISPATCHED the
        request holds an endpoint credit until `complete` is called."""
        outcome = self.offer(request)
        if outcome is not None:
            return outcome
        return await self.wait(request)

    def offer(self, request: FlowRequest) -> Outcome | None:
        """`admit` without waiting: the outcome if it is decided at once
        (dispatched in the pass the enqueue starts, or rejected), else None
        and the request is queued: `await wait(request)` then."""
        now = self._clock()
        outcome, done = self.core.enqueue_and_dispatch(request, now)
        if outcome is not None:
            self._report(request, now)
            return outcome
        self._resolve_all(done, now)
        if request.outcome is None and self._on_queued is not None:
            self._on_queued(request)
        return request.outcome

    async def wait(self, request: FlowRequest) -> Outcome:
        """The outcome of a request that `offer` queued. Cancelling the
        waiting task removes it from its queue (or hands back the credit of a
        request dispatched a moment earlier)."""
        if request.outcome is not None:
            return request.outcome
        future = asyncio.get_running_loop().create_future()
        self._waiters[request] = future
        if request.deadline < self._ttl_timer_at:
            self._arm_ttl_timer(request.deadline)
        try:
            return await future
        except asyncio.CancelledError:
            self.withdraw(request)
            raise

    def withdraw(self, request: FlowRequest) -> None:
        """The request's client is gone: take it out of its queue, or give
        back the credit it was dispatched with a moment ago. Safe to repeat."""
        self._waiters.pop(request, None)
        now = self._clock()
        if self.core.cancel(request, now):
            self._report(request, now)
            self._after_queue_change()
        elif request.state is State.DISPATCHED:
            self.complete(request)

    def complete(
        self, request: FlowRequest, input_tokens: int | None = None, output_tokens: int = 0
    ) -> None:
        """A dispatched request is finished (or its stream closed early):
        release its endpoint credit, correct its fairness charge, and let the
        next requests go."""
        now = self._clock()
        if self.core.complete(request, now, input_tokens, output_tokens):
            if self.evictor is not None:
                self.evictor.on_completed(request)
            if self._on_complete is not None:
                self._on_complete(request)
            self._dispatch(now)
            if self._idle_timer is None:
                self._arm_idle_timer()

    def poke(self) -> None:
        """Something outside the core may have freed room (new metrics, new
        endpoints): dispatch what can go now."""
        self._dispatch(self._clock())

    async def shutdown(self, grace: float) -> None:
        """Admit nothing more; let the queue drain for up to `grace` seconds,
        then end what is left with rejected-shutting-down."""
        self._closing = True
        self.core.close()
        if self.core.queued_requests:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        now = self._clock()
        for request in self.core.drain(Outcome.REJECTED_SHUTTING_DOWN, now):
            self._resolve(request, now)
        self._arm_ttl_timer(None)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    # -- internals -------------------------------------------------------------

    def _dispatch(self, now: float) -> None:
        self._resolve_all(self.core.dispatch(now), now)

    def _resolve_all(self, done: list[FlowRequest], now: float) -> None:
        """Deliver the outcomes of a dispatch pass."""
        for request in done:
            self._resolve(request, now)
        if self._closing and not self.core.queued_requests:
            self._drained.set()
        if self.evictor is not None and self.core.queued_requests:
            self._evict_for_waiting()

    def _resolve(self, request: FlowRequest, now: float) -> None:
        future = self._waiters.pop(request, None)
        if future is not None and not future.done():
            future.set_result(request.outcome)
        self._report(request, now)

    def _evict_for_waiting(self) -> None:
        """A band still waits after a pass: the pool is full for it, so a
        lower sheddable request in flight may give its endpoint back."""
        assert self.evictor is not None
        waiting = next((band for band in self.core.bands() if band.count), None)
        if waiting is None:
            return
        victim = self.evictor.victim_for(waiting.priority)
        if victim is not None and self._on_evict is not None:
            self._on_evict(victim)

    def _report(self, request: FlowRequest, now: float) -> None:
        if self.evictor is not None and request.outcome is Outcome.DISPATCHED:
            self.evictor.on_dispatched(request)
        if self._on_outcome is not None:
            self._on_outcome(request, now)

    def _after_queue_change(self) -> None:
        self._dispatch(self._clock())
        if self._idle_timer is None:
            self._arm_idle_timer()

    def _arm_ttl_timer(self, deadline: float | None) -> None:
        """Fire at `deadline` (None: no timer), replacing a later timer."""
        if self._ttl_timer is not None:
            self._ttl_timer.cancel()
            self._ttl_timer = None
        if deadline is None:
            self._ttl_timer_at = inf
            return
        self._ttl_timer_at = deadline
        delay = max(0.0, deadline - self._clock())
        self._ttl_timer = asyncio.get_running_loop().call_later(delay, self._on_ttl_timer)

    def _on_ttl_timer(self) -> None:
        self._ttl_timer = None
        now = self._clock()
        for request in self.core.expire(now):
            self._resolve(request, now)
        self._after_queue_change()
        self._arm_ttl_timer(self.core.next_deadline())

    def _arm_idle_timer(self) -> None:
        when = self.core.next_idle_check()
        if when is None:
            return
        delay = max(0.0, when - self._clock())
        self._idle_timer = asyncio.get_running_loop().call_later(delay, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._idle_timer = None
        collected = self.core.collect_idle(self._clock())
        if collected and self._on_flows_collected is not None:
            self._on_flows_collected(collected)
        self._arm_idle_timer()
