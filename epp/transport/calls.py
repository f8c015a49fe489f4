"""One gRPC call as its handler sees it (`Call`), the handler's callbacks
(`Handler`) and how a method's handler is made (`Route`). The connection
(`epp.transport.connection`) owns the call's stream, its windows and its
bytes; the call is the handler's way to answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from epp.transport.framing import MessageReader, Status

if TYPE_CHECKING:
    from epp.transport.connection import GrpcConnection


class Handler(Protocol):
    def on_message(self, payload: bytes) -> None: ...

    def on_half_close(self) -> None: ...

    def on_cancel(self) -> None: ...


Route = Callable[["Call"], Handler]
"""Makes the handler of one call to a method (routes are keyed by `/package.Service/Method`)."""


class Call:
    """One gRPC call, as its handler sees it."""

    __slots__ = (
        "_connection",
        "_outbox",
        "_trailers",
        "closed",
        "delivered",
        "handler",
        "headers_sent",
        "id",
        "reader",
    )

    def __init__(self, connection: GrpcConnection, stream_id: int, max_message_bytes: int) -> None:
        self._connection = connection
        self.id = stream_id
        self.handler: Handler | None = None
        self.headers_sent = False
        self.closed = False
        self.delivered = False
        """A message reached the handler (a reset before that is premature)."""
        self.reader = MessageReader(max_message_bytes)
        self._outbox = bytearray()
        self._trailers: list[tuple[bytes, bytes]] | None = None

    def send(self, payload: bytes) -> None:
        """Send one message (ignored once the call is over)."""
        if not self.closed:
            self._connection.send_message(self, payload)

    def finish(self, status: Status = Status.OK, message: str = "") -> None:
        """End the call with `status` (ignored once the call is over)."""
        if not self.closed:
            self.closed = True
            self._connection.finish(self, status, message)
