"""The grpc.aio adapter: Envoy's `ExternalProcessor/Process` streams fed to ExtProcStream.

One task per stream reads ProcessingRequests, feeds the machine and carries
out its events: replies are written in order, `AdmissionNeeded` awaits
`admission.admit`, `Release` calls `admission.complete`. When Envoy drops
the stream (client gone), grpc.aio cancels the task: a pending `admit` is
cancelled with it (which removes the request from its queue), and the
`finally` closes the machine, releasing a dispatched request exactly once.

Release and Rejected events are settled before the replies of the same batch
are written: Envoy may end the stream as soon as it has the last reply, and
the task is then cancelled inside that write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc

from epp.extproc.events import AdmissionNeeded, Event, Rejected, Release
from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.extproc.messages import ProcessingRequest, ProcessingResponse
from epp.extproc.stream import ExtProcStream, PriorityResolver, StreamSettings
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest

log = logging.getLogger(__name__)


class Admission(Protocol):
    """What the adapter needs from flow control (epp.admission.AdmissionController)."""

    async def admit(self, request: FlowRequest) -> Outcome: ...

    def complete(
        self, request: FlowRequest, input_tokens: int | None = None, output_tokens: int = 0
    ) -> None: ...


StreamListener = Callable[[Rejected | Release], None]
"""Told of every local error reply and every release (for metrics)."""


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        admission: Admission,
        priority_of: PriorityResolver,
        settings: StreamSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        listener: StreamListener | None = None,
    ) -> None:
        self._admission = admission
        self._priority_of = priority_of
        self._settings = settings or StreamSettings()
        self._clock = clock
        self._listener = listener
        self.open_streams = 0

    async def Process(
        self,
        request_iterator: AsyncIterator[ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        stream = ExtProcStream(self._priority_of, self._settings)
        self.open_streams += 1
        try:
            async for message in request_iterator:
                await self._carry_out(stream, stream.receive(message, self._clock()), context)
        finally:
            self.open_streams -= 1
            for event in stream.close():
                self._settle(event)

    async def _carry_out(
        self, stream: ExtProcStream, events: list[Event], context: grpc.aio.ServicerContext
    ) -> None:
        for event in events:
            if isinstance(event, Release | Rejected):
                self._settle(event)
        for event in events:
            if isinstance(event, ProcessingResponse):
                await context.write(event)
            elif isinstance(event, AdmissionNeeded):
                try:
                    outcome = await self._admission.admit(event.request)
                except Exception:
                    log.exception("admission failed for request %s", event.request.request_id)
                    follow_up = stream.admission_failed()
                else:
                    follow_up = stream.admitted(outcome)
                await self._carry_out(stream, follow_up, context)

    def _settle(self, event: Event) -> None:
        if isinstance(event, Release):
            self._admission.complete(event.request, event.input_tokens, event.output_tokens)
        if self._listener is not None and isinstance(event, Release | Rejected):
            self._listener(event)


def add_to_server(servicer: ExtProcServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)


def server_options(settings: StreamSettings) -> list[tuple[str, int]]:
    """gRPC channel options: room for a whole body in one message, plus framing."""
    limit = settings.max_body_bytes + 1024 * 1024
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
    ]
