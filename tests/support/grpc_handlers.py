"""Two gRPC handlers to drive epp.transport with: Echo answers, Sink never does.

A handler is made per call (`GrpcServer({path: lambda call: Echo(call, log)})`,
or `{path: Echo}` without a log). Given a list, a handler appends "half-close"
and "cancel" to it as the transport tells it, so a test can assert what the
handler was told, and how often.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.transport import Call

ECHO = "/test.Echo/Echo"
SINK = "/test.Echo/Sink"


class Echo:
    """Sends every message back; ends OK when the client is done."""

    def __init__(self, call: Call, log: list[str] | None = None) -> None:
        self.call = call
        self.log = log

    def on_message(self, payload: bytes) -> None:
        self.call.send(payload)

    def on_half_close(self) -> None:
        self.note("half-close")
        self.call.finish()

    def on_cancel(self) -> None:
        self.note("cancel")

    def note(self, event: str) -> None:
        if self.log is not None:
            self.log.append(event)


class Sink(Echo):
    """Reads and never answers (a queued request)."""

    def on_message(self, payload: bytes) -> None:
        pass

    def on_half_close(self) -> None:
        self.note("half-close")
