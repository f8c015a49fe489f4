"""The live end of a disaggregated request's prefill stage.

A request the scheduler sends to a prefill endpoint holds one of that
endpoint's prefill credits from its dispatch (`epp.scheduling.stages`). Its
prefill is over when the decode server's response begins (the ext_proc
stream's `PrefillDone`, at the response headers: the sidecar sends the
decode leg only once the prefill has answered), or, if that never comes,
`timeout_s` after the dispatch (`flowControl.gate.prefillTimeout`, 60 s by
default, as long as the routing sidecar waits for a prefill); then the
credit returns and the core
dispatches what can go. At the latest the credit returns when the request
ends (the gate's `on_complete`).

One timer per request in its prefill stage, so at most one per prefill
credit; O(1) per dispatch, response and completion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from epp.flowcontrol.request import FlowRequest
from epp.scheduling.stages import PrefillCredits, prefiller_of


class PrefillStage:
    __slots__ = ("_poke", "_timers", "credits", "timeout_s")

    def __init__(
        self,
        credits: PrefillCredits,
        poke: Callable[[], None],
        timeout_s: float,
    ) -> None:
        self.credits = credits
        self.timeout_s = timeout_s
        self._poke = poke
        self._timers: dict[FlowRequest, asyncio.TimerHandle] = {}

    def on_outcome(self, request: FlowRequest, now: float) -> None:
        """A request left flow control: time the prefill stage of a dispatched one."""
        outcome = request.outcome
        if outcome is not None and outcome.is_dispatched and prefiller_of(request) is not None:
            loop = asyncio.get_running_loop()
            self._timers[request] = loop.call_later(self.timeout_s, self.prefill_done, request)

    def prefill_done(self, request: FlowRequest) -> None:
        """`request`'s prefill is over: its credit returns, the core dispatches."""
        timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()
        if self.credits.release(request):
            self._poke()

    def on_complete(self, request: FlowRequest) -> None:
        """The request ended (the gate returned its credit): drop its timer."""
        timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()

    @property
    def timed(self) -> int:
        return len(self._timers)
