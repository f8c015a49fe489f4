"""The ext_proc service: Envoy's `ExternalProcessor/Process` calls fed to ExtProcStream.

Served by epp.transport (gRPC over h2 in the event loop's thread). Each call
gets an `ExtProcCall`: every message from Envoy goes to its stream machine,
whose replies are sent in order. `AdmissionNeeded` offers the request to
flow control; when it must queue, one task awaits its outcome (messages
arriving meanwhile wait their turn). `Release` calls `admission.complete`
(with the streamed response's time per output token), `FirstToken`
`admission.first_token` and `PrefillDone` `admission.prefill_done`, once
the replies of the turn are written.
The EPP's own time on the response (each response message's handling,
replies included; the waits between them are the model server's) is summed
per call and reported once when the call ends, if it reached the response
(`on_response_processed`, the reference's response processing duration).
The call ends OK once Envoy has sent its last message and the admission is
settled, or at once after an ImmediateResponse (Envoy sends nothing more).
When Envoy resets the stream (its client went away) a queued request is
withdrawn from its queue, and the machine is closed, which
releases a dispatched request exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from google.protobuf.message import DecodeError

from epp.extproc.events import (
    AdmissionNeeded,
    Event,
    FirstToken,
    PrefillDone,
    Rejected,
    Release,
)
from epp.extproc.messages import ProcessingRequest, ProcessingResponse
from epp.extproc.stream import ExtProcStream, Phase, PriorityResolver, StreamSettings
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.request import InferenceRequest
from epp.transport import Call, Status

log = logging.getLogger(__name__)

PROCESS_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


class Admission(Protocol):
    """What the service needs from flow control (epp.serve.admission.AdmissionController)."""

    def offer(self, request: FlowRequest) -> Outcome | None: ...

    async def wait(self, request: FlowRequest) -> Outcome: ...

    def withdraw(self, request: FlowRequest) -> None: ...

    def complete(
        self, request: FlowRequest, usage: Usage | None = None, itl: float | None = None
    ) -> None: ...

    def first_token(self, request: FlowRequest) -> None: ...

    def prefill_done(self, request: FlowRequest) -> None: ...


class AdmissionDenied(Exception):
    """Raised by an `Admission.wait` whose admitters refused the request
    where they run (the core owner, under `epp serve --workers`): the call
    answers it as a local `screen` denial."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Screen = Callable[[FlowRequest], str | None]
"""Why a complete request is refused before flow control (None: it goes on):
the configured admitters."""

Tokenize = Callable[[InferenceRequest], Awaitable[None]]
"""Fills a request's token ids before it is offered (`epp.serve.tokenizer`)."""

StreamListener = Callable[[Rejected | Release], None]
"""Told of every local error reply and every release (for metrics)."""


class ExtProcService:
    """Makes an `ExtProcCall` per Process call (its `open` is the route)."""

    def __init__(
        self,
        admission: Admission,
        priority_of: PriorityResolver,
        settings: StreamSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        listener: StreamListener | None = None,
        screen: Screen | None = None,
        on_response_processed: Callable[[float], None] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        tokenize: Tokenize | None = None,
    ) -> None:
        self.admission = admission
        self.tokenize = tokenize
        """When set, awaited on each request before it is offered (the token
        producer); it never raises, so a request goes on whatever it does."""
        self.screen = screen
        self.calls: dict[FlowRequest, ExtProcCall] = {}
        """The open calls by the request they asked admission for."""
        self.priority_of = priority_of
        self.settings = settings or StreamSettings()
        self.clock = clock
        self.listener = listener
        self.on_response_processed = on_response_processed
        """Told, once per call that reached the response, the seconds the EPP spent on it."""
        self.timer = timer
        self.open_streams = 0

    def open(self, call: Call) -> ExtProcCall:
        self.open_streams += 1
        return ExtProcCall(self, call)

    def evict(self, request: FlowRequest) -> None:
        """End `request`'s call as evicted (nothing if its call is over)."""
        call = self.calls.get(request)
        if call is not None:
            call.evict()

    def settle(self, event: Rejected | Release | PrefillDone | FirstToken) -> None:
        if isinstance(event, FirstToken):
            self.admission.first_token(event.request)
            return
        if isinstance(event, PrefillDone):
            self.admission.prefill_done(event.request)
            return
        if isinstance(event, Release):
            self.admission.complete(
                event.request, event.usage, event.time_per_output_token(self.clock())
            )
        if self.listener is not None:
            self.listener(event)


class ExtProcCall:
    """One Process call: see the module docstring."""

    __slots__ = (
        "_admitting",
        "_admitting_request",
        "_call",
        "_closed",
        "_half_closed",
        "_machine",
        "_response_seconds",
        "_service",
        "_waiting",
    )

    def __init__(self, service: ExtProcService, call: Call) -> None:
        self._service = service
        self._call = call
        self._machine = ExtProcStream(service.priority_of, service.settings)
        self._admitting: asyncio.Task[None] | None = None
        self._admitting_request: FlowRequest | None = None
        self._waiting: list[ProcessingRequest] = []
        self._half_closed = False
        self._closed = False
        self._response_seconds = 0.0

    def on_message(self, payload: bytes) -> None:
        service = self._service
        started = service.timer()
        try:
            message = ProcessingRequest.FromString(payload)
        except DecodeError:
            self._end(Status.INVALID_ARGUMENT, "not a ProcessingRequest")
            return
        if self._admitting is not None:
            self._waiting.append(message)
            return
        machine = self._machine
        responding = machine.phase is Phase.UPSTREAM or machine.phase is Phase.RESPONSE_BODY
        self._carry_out(machine.receive(message, service.clock()))
        if responding:
            self._response_seconds += service.timer() - started

    def on_half_close(self) -> None:
        self._half_closed = True
        if self._admitting is None:
            self._end(Status.OK)

    def on_cancel(self) -> None:
        if self._admitting is not None:
            if self._admitting_request is not None:  # else still tokenizing
                self._service.admission.withdraw(self._admitting_request)
            self._admitting.cancel()
            self._admitting = self._admitting_request = None  # no task <-> call cycle
        self._close()

    def _carry_out(self, events: list[Event]) -> None:
        """Send the replies in order. Releases and rejections are settled at
        the end of this turn of the event loop, after the turn's replies are
        written: Envoy goes on while the EPP does its bookkeeping."""
        if self._closed:
            return
        answered = False
        for event in events:
            if isinstance(event, ProcessingResponse):
                self._call.send(event.SerializeToString())
                answered = answered or event.WhichOneof("response") == "immediate_response"
            elif isinstance(event, AdmissionNeeded):
                self._offer(event.request)
            else:
                asyncio.get_running_loop().call_soon(self._service.settle, event)
        if answered:
            self._end(Status.OK)  # Envoy sends nothing more on this stream

    def evict(self) -> None:
        self._carry_out(self._machine.evict())

    def _offer(self, request: FlowRequest) -> None:
        tokenize = self._service.tokenize
        payload = request.payload
        if tokenize is not None and isinstance(payload, InferenceRequest):
            # messages arriving meanwhile wait, as while admission waits
            self._admitting = asyncio.get_running_loop().create_task(
                self._tokenize_then_offer(request, tokenize(payload))
            )
            return
        self._offer_now(request)

    async def _tokenize_then_offer(self, request: FlowRequest, tokenizing: Awaitable[None]) -> None:
        await tokenizing
        payload = request.payload
        if isinstance(payload, InferenceRequest):
            request.input_tokens = payload.input_tokens
        self._admitting = None
        self._offer_now(request)
        if self._admitting is None:  # settled at once: what waited goes on
            self._resume()

    def _offer_now(self, request: FlowRequest) -> None:
        self._service.calls[request] = self
        try:
            screen = self._service.screen
            denial = screen(request) if screen is not None else None
            if denial is not None:
                self._carry_out(self._machine.denied(denial))
                return
            outcome = self._service.admission.offer(request)
        except Exception:
            log.exception("admission failed for request %s", request.request_id)
            self._carry_out(self._machine.admission_failed())
            return
        if outcome is not None:
            self._carry_out(self._machine.admitted(outcome))
            return
        self._admitting_request = request
        self._admitting = asyncio.get_running_loop().create_task(self._wait(request))

    async def _wait(self, request: FlowRequest) -> None:
        try:
            outcome = await self._service.admission.wait(request)
        except asyncio.CancelledError:
            raise
        except AdmissionDenied as denial:
            follow_up = self._machine.denied(denial.reason)
        except Exception:
            log.exception("admission failed for request %s", request.request_id)
            follow_up = self._machine.admission_failed()
        else:
            follow_up = self._machine.admitted(outcome)
        self._admitting = self._admitting_request = None
        try:
            self._carry_out(follow_up)
        except Exception:
            log.exception("request %s: failed after admission", request.request_id)
            self._end(Status.INTERNAL, "internal error")
            return
        self._resume()

    def _resume(self) -> None:
        """Carry out the messages that came while the request was admitted."""
        try:
            waiting, self._waiting = self._waiting, []
            for message in waiting:
                self._carry_out(self._machine.receive(message, self._service.clock()))
        except Exception:
            log.exception("call failed after admission")
            self._end(Status.INTERNAL, "internal error")
            return
        if self._half_closed and not self._closed:
            self._end(Status.OK)

    def _end(self, status: Status, message: str = "") -> None:
        self._close()
        self._call.finish(status, message)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._service.open_streams -= 1
        service = self._service
        request = self._machine.request
        if request is not None and service.calls.get(request) is self:
            del service.calls[request]
        for event in self._machine.close():
            service.settle(event)
        if self._response_seconds and service.on_response_processed is not None:
            service.on_response_processed(self._response_seconds)
