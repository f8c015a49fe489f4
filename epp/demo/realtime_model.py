"""The simulator's model server (`epp.sim.server_model.ModelServer`:
continuous batching, KV blocks, waiting queue) played on the event loop's
clock, for the demo's HTTP servers (`epp.demo.model_server`).

One timer fires when the model's batch next changes and advances it to that
time, which resolves the futures of the requests whose first token or
completion has come; an admission may bring that time forward, so the timer
is re-set after each call.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

from epp.scheduling.kvblocks import KVEvent
from epp.sim.server_model import ModelServer, ServerParams, ServerRequest


@dataclass(slots=True, eq=False)
class Pending:
    """What a handler waits on while the model works on its request."""

    first_token: asyncio.Future[float]
    finished: asyncio.Future[float]
    request: ServerRequest | None = None

    def cached_tokens(self) -> int:
        return self.request.cached_tokens if self.request is not None else 0


class RealTimeModel:
    """A ModelServer on the event loop's clock (seconds since creation).

    One timer at a time, set for the model's next event; an admission may
    bring that event forward, so the timer is re-set after each call."""

    def __init__(
        self,
        params: ServerParams,
        on_kv_events: Callable[[list[KVEvent]], None] | None = None,
    ) -> None:
        self.model = ModelServer(params, self)
        self._on_kv_events = on_kv_events
        if on_kv_events is not None:
            self.model.kv_log = []
        self._loop = asyncio.get_running_loop()
        self._origin = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._sequence = 0
        self.admitted_total = 0
        self.finished_total = 0

    def now(self) -> float:
        return self._loop.time() - self._origin

    def submit(
        self,
        prompt_tokens: int,
        output_tokens: int,
        lora: str | None = None,
        remote_kv: bool = False,
        block_keys: tuple[int, ...] = (),
        tokens: tuple[int, ...] = (),
    ) -> Pending | None:
        """The request's futures, or None when the waiting queue is full."""
        pending = Pending(self._loop.create_future(), self._loop.create_future())
        self._sequence += 1
        request = ServerRequest(
            self._sequence,
            prompt_tokens,
            output_tokens,
            lora=lora,
            owner=pending,
            remote_kv=remote_kv,
            block_keys=block_keys,
            token_ids=tokens,
        )
        pending.request = request
        if not self.model.admit(request, self.now()):
            return None
        self.admitted_total += 1
        self._schedule()
        self._drain_kv_log()
        return pending

    def fail(self) -> None:
        """The server restarts: its cache is lost (told as AllBlocksCleared)."""
        for request in self.model.fail():
            for future in (request.owner.first_token, request.owner.finished):
                if not future.done():
                    future.set_exception(ConnectionResetError("the server restarted"))
        self._schedule()
        self._drain_kv_log()

    def _drain_kv_log(self) -> None:
        log = self.model.kv_log
        if log and self._on_kv_events is not None:
            self.model.kv_log = []
            self._on_kv_events(log)

    def abort(self, pending: Pending) -> bool:
        """Take an unfinished request out of the model; whether it was there."""
        finished = pending.finished
        if pending.request is None or (finished.done() and not finished.cancelled()):
            return False
        aborted = self.model.abort(pending.request, self.now())
        self._schedule()
        return aborted

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        at = self.model.next_event_time()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at != math.inf:
            self._timer = self._loop.call_at(self._origin + at, self._fire, at)

    def _fire(self, at: float) -> None:
        self._timer = None
        self._timer_at = math.inf
        self.model.advance(max(at, self.now()))
        self._schedule()
        self._drain_kv_log()

    # ServerListener
    def started(self, request: ServerRequest, now: float) -> None:
        return None

    def first_token(self, request: ServerRequest, now: float) -> None:
        future = request.owner.first_token
        if not future.done():
            future.set_result(now)

    def finished(self, request: ServerRequest, now: float) -> None:
        self.finished_total += 1
        pending = request.owner
        if not pending.first_token.done():
            pending.first_token.set_result(now)
        if not pending.finished.done():
            pending.finished.set_result(now)
