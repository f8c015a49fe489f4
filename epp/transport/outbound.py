"""One connection's sending side: which calls have something to send, and
which wait for which flow-control window (RFC 9113 §5.2).

`pump` moves a call's queued messages into h2 as DATA frames within its
stream's window, the connection's and the peer's frame size, then its
trailers. A call that runs out of window is filed by the window it waits
for, so that each window's growth pumps only the calls it can serve: a
stream's WINDOW_UPDATE its own call (`stream_window_opened`), the
connection's the calls waiting on it, oldest first, until it is spent, and
a SETTINGS frame raising the initial window the calls waiting on their
stream's (`initial_window_raised`). No frame walks every open call.
"""

from __future__ import annotations

from collections.abc import Callable

import h2.exceptions

from epp.transport.calls import Call
from epp.transport.guards import Guards
from epp.transport.h2_internals import ServerH2Connection

WRITE_BATCH_BYTES = 64 * 1024
"""Pumped bytes after which a flush writes and looks at pause_writing."""


class Outbound:
    """The calls of one connection with something to send (see the module
    docstring). `finished(call)` is told when a call's trailers are out or
    its stream is gone; `paused` is set while the transport asks to pause
    writing, and nothing is pumped then."""

    __slots__ = (
        "_finished",
        "_guards",
        "_h2",
        "blocked_on_connection",
        "blocked_on_stream",
        "paused",
        "unsent",
    )

    def __init__(
        self, h2_connection: ServerH2Connection, guards: Guards, finished: Callable[[Call], None]
    ) -> None:
        self._h2 = h2_connection
        self._guards = guards
        self._finished = finished
        self.unsent: dict[Call, None] = {}
        """Calls with messages or trailers to send at the next flush, in order."""
        self.blocked_on_stream: dict[Call, None] = {}
        """Calls with messages that wait for their stream's flow-control window."""
        self.blocked_on_connection: dict[Call, None] = {}
        """Calls with messages that wait for the connection's flow-control
        window only (their stream's is open), in the order they blocked."""
        self.paused = False

    def queue(self, call: Call) -> None:
        """`call` has something new to send (a message or its trailers)."""
        self.unsent[call] = None

    def forget(self, call: Call) -> None:
        self.unsent.pop(call, None)
        self.blocked_on_stream.pop(call, None)
        self.blocked_on_connection.pop(call, None)

    def stream_window_opened(self, call: Call) -> None:
        if call in self.blocked_on_stream:
            self.unsent[call] = None

    def initial_window_raised(self) -> None:
        """The peer's SETTINGS raised SETTINGS_INITIAL_WINDOW_SIZE: every
        stream's window grew, so the calls waiting on theirs may go on."""
        self.unsent.update(self.blocked_on_stream)

    def pump_ready(self, write: Callable[[bytes], None] | None) -> int:
        """Pump what the windows let through now: the calls the connection's
        window waited for, oldest first, then those with something new;
        `write` gets h2's output every `WRITE_BATCH_BYTES`. Returns the bytes sent."""
        sent = 0
        if (
            self.blocked_on_connection
            and not self.paused
            and self._h2.outbound_flow_control_window > 0
        ):
            sent += self._pump_blocked_on_connection(write)
        if self.unsent and not self.paused:
            unsent, self.unsent = self.unsent, {}
            pumped = 0
            for call in unsent:
                if self.paused:
                    self.unsent[call] = None
                    continue
                pumped += self.pump(call)
                if pumped >= WRITE_BATCH_BYTES and write is not None:
                    sent += pumped
                    pumped = 0
                    write(self._h2.data_to_send())
            sent += pumped
        return sent

    def _pump_blocked_on_connection(self, write: Callable[[bytes], None] | None) -> int:
        """Each pump sends, or moves its call to the stream-blocked set, or
        spends the connection's window and ends the loop."""
        blocked = self.blocked_on_connection
        sent = pumped = 0
        while blocked and self._h2.outbound_flow_control_window > 0 and not self.paused:
            call = next(iter(blocked))
            del blocked[call]
            pumped += self.pump(call)
            if pumped >= WRITE_BATCH_BYTES and write is not None:
                sent += pumped
                pumped = 0
                write(self._h2.data_to_send())
        return sent + pumped

    def pump(self, call: Call) -> int:
        """Send what flow control lets through now; the trailers once all is
        out. Returns the bytes sent."""
        h2_connection = self._h2
        outbox = call._outbox
        sent = 0
        try:
            while outbox:
                size = min(
                    len(outbox),
                    h2_connection.local_flow_control_window(call.id),
                    h2_connection.max_outbound_frame_size,
                )
                if size <= 0:
                    self._block(call)
                    return sent
                h2_connection.send_data(call.id, bytes(outbox[:size]))
                del outbox[:size]
                sent += size
                self._guards.data_frame_sent()
            self.blocked_on_stream.pop(call, None)
            self.blocked_on_connection.pop(call, None)
            if call._trailers is not None:
                h2_connection.send_headers(call.id, call._trailers, end_stream=True)
                self._finished(call)
        except h2.exceptions.StreamClosedError:
            self._finished(call)
        return sent

    def _block(self, call: Call) -> None:
        """File a call that has data but no window, by the window it waits for."""
        if self._h2.streams[call.id].outbound_flow_control_window <= 0:
            self.blocked_on_connection.pop(call, None)
            self.blocked_on_stream[call] = None
        else:
            self.blocked_on_stream.pop(call, None)
            self.blocked_on_connection[call] = None
