"""The live shell's asyncio adapter over the core (`epp.scheduling.core`):
futures for the requests that wait, and one timer.

`admit` queues a request and returns its outcome when it is dispatched or
ended; it is `offer` (decides at once if it can) then `wait`, for callers
that would rather not start a task for a request that need not wait.
The core dispatches by itself: every call here hands it one event (an
arrival, a completion with its usage and latency, a first token, the end of
a prefill, a cancellation, a reload, `poke` for new metrics or endpoints)
and resolves the futures of what it settled. Nothing here decides when to
dispatch or whom to evict, so a backlog drains as fast as the pool takes it.

A request dispatched in the pass that its own `admit` started returns without
waiting for anything; only requests that really queue create a future.
Cancelling the task that awaits `admit` (or calling `withdraw`) removes a
queued request at once, or hands back the endpoint credit of a request
dispatched a moment earlier.

Each call into the core is what the reference calls a dispatch cycle: one
pass that dispatches as much as it can. `on_cycle` is told how long each
took (perf-counter seconds), and `on_enqueued` how long an arrival's call
took, for the reference's dispatch-cycle and enqueue-duration histograms.

The timer: the core's `next_wakeup()` (the next TTL or prefill deadline, or
idle-flow check) is armed after every event when it is earlier than the armed time;
when the timer fires it `poke`s the core and arms the next wakeup. A later
wakeup never re-arms (that would cost a timer per dispatch): the timer may
fire early, find nothing due and arm again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import inf
from time import perf_counter
from typing import Any, TypeVar

from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.core import Core

OutcomeListener = Callable[[FlowRequest, float], None]
"""Told of every admitted request's outcome, with the time it was decided.
(`on_complete` is told when a dispatched request gives its endpoint back,
whichever path completed it, so that the two together count what runs;
`on_queued` when `offer` leaves a request waiting in a queue.)"""

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class AdmissionController:
    core: Core
    clock: Callable[[], float] = time.monotonic
    on_outcome: OutcomeListener | None = None
    on_complete: Callable[[FlowRequest], None] | None = None
    on_queued: Callable[[FlowRequest], None] | None = None
    on_cycle: Callable[[float], None] | None = None
    on_enqueued: Callable[[FlowRequest, float], None] | None = None
    _timed: bool = field(default=False, init=False, repr=False)
    """Whether calls into the core are timed (`on_cycle` or `on_enqueued`)."""
    _waiters: dict[FlowRequest, asyncio.Future[Outcome]] = field(
        default_factory=dict, init=False, repr=False
    )
    _timer: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    _timer_at: float = field(default=inf, init=False, repr=False)
    _drained: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self._timed = self.on_cycle is not None or self.on_enqueued is not None

    @property
    def queued(self) -> int:
        return self.core.queued_requests

    @property
    def in_flight(self) -> int:
        return self.core.in_flight

    @property
    def wakeup_at(self) -> float:
        """When (on `clock`) the timer will next poke the core; inf: not armed."""
        return self._timer_at

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
        now = self.clock()
        if not self._timed:
            outcome, done = self.core.arrive(request, now)
        else:
            start = perf_counter()
            outcome, done = self.core.arrive(request, now)
            took = perf_counter() - start
            if self.on_cycle is not None:
                self.on_cycle(took)
            if self.on_enqueued is not None:
                self.on_enqueued(request, took)
        if outcome is not None:
            if self.on_outcome is not None:
                self.on_outcome(request, now)
            return outcome
        self._settle(done, now)
        if request.outcome is None and self.on_queued is not None:
            self.on_queued(request)
        return request.outcome

    async def wait(self, request: FlowRequest) -> Outcome:
        """The outcome of a request that `offer` queued. Cancelling the
        waiting task removes it from its queue (or hands back the credit of a
        request dispatched a moment earlier)."""
        if request.outcome is not None:
            return request.outcome
        future = asyncio.get_running_loop().create_future()
        self._waiters[request] = future
        try:
            return await future
        except asyncio.CancelledError:
            self.withdraw(request)
            raise

    def withdraw(self, request: FlowRequest) -> None:
        """The request's client is gone: take it out of its queue, or give
        back the credit it was dispatched with a moment ago. Safe to repeat."""
        self._waiters.pop(request, None)
        if request.state is State.DISPATCHED:
            self.complete(request)
            return
        now = self.clock()
        self._settle(self._cycle(self.core.cancel, request, now), now)

    def complete(
        self, request: FlowRequest, usage: Usage | None = None, itl: float | None = None
    ) -> None:
        """A dispatched request is finished (or its stream closed early):
        release its endpoint credit and correct its fairness charge to its
        `usage` (`itl`: its streamed response's time per output token, None
        if unknown); the core lets the next requests go."""
        if request.state is not State.DISPATCHED:
            return
        now = self.clock()
        if self.on_cycle is None:
            settled = self.core.complete(request, now, usage, itl)
        else:
            settled = self._cycle(self.core.complete, request, now, usage, itl)
        if self.on_complete is not None:
            self.on_complete(request)
        self._settle(settled, now)

    def adopt(self, request: FlowRequest, endpoint: str) -> None:
        """`request` already runs at `endpoint` (`Core.adopt`): it holds its
        credit until `complete`. It frees nothing, so nothing dispatches."""
        self.core.adopt(request, endpoint, self.clock())

    def seed_limits(self, limits: Mapping[str, int]) -> None:
        """Learned limits another decider of the pool had (`Core.seed_limits`)."""
        now = self.clock()
        self._settle(self._cycle(self.core.seed_limits, limits, now), now)

    def screen(self, request: FlowRequest) -> str | None:
        """The configured admitters' refusal of a complete request, if one refuses."""
        return self.core.screen(request, self.clock())

    def first_token(self, request: FlowRequest) -> None:
        """A streamed response's first bytes came: its server runs it."""
        now = self.clock()
        self._settle(self._cycle(self.core.first_token, request, now), now)

    def prefill_done(self, request: FlowRequest) -> None:
        """A disaggregated request's decode response began: its prefill is over."""
        now = self.clock()
        self._settle(self._cycle(self.core.prefill_done, request, now), now)

    def reload(self, config: FlowControlConfig, **changes: Any) -> None:
        """New flow-control limits and policies (and what `Core.reload`
        takes besides); the core dispatches what they let through."""
        now = self.clock()
        self._settle(self._cycle(self.core.reload, config, now, **changes), now)

    def poke(self) -> None:
        """Something outside the core may have freed room (new metrics, new
        endpoints): let the core do what it can now."""
        now = self.clock()
        self._settle(self._cycle(self.core.poke, now), now)

    async def shutdown(self, grace: float) -> None:
        """Admit nothing more; let the queue drain for up to `grace` seconds,
        then end what is left with rejected-shutting-down."""
        self._closing = True
        self.core.close()
        if self.core.queued_requests:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        now = self.clock()
        for request in self.core.drain(Outcome.REJECTED_SHUTTING_DOWN, now):
            self._resolve(request, now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = -inf  # nothing arms the timer again

    # -- internals -------------------------------------------------------------

    def _cycle(self, call: Callable[..., T], *args: object, **kwargs: Any) -> T:
        """`call(*args, **kwargs)`, one call into the core, timed for `on_cycle`."""
        if self.on_cycle is None:
            return call(*args, **kwargs)
        start = perf_counter()
        result = call(*args, **kwargs)
        self.on_cycle(perf_counter() - start)
        return result

    def _settle(self, settled: list[FlowRequest], now: float) -> None:
        """Deliver the outcomes the core settled, then arm the timer."""
        for request in settled:
            self._resolve(request, now)
        if self._closing and not self.core.queued_requests:
            self._drained.set()
        when = self.core.next_wakeup()
        if when is not None and when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, when - self.clock()), self._on_timer
            )

    def _resolve(self, request: FlowRequest, now: float) -> None:
        future = self._waiters.pop(request, None)
        if future is not None and not future.done():
            future.set_result(request.outcome)
        if self.on_outcome is not None:
            self.on_outcome(request, now)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = inf
        self.poke()
