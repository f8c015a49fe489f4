"""One HTTP/2 connection of the gRPC server: its calls, limits and backpressure.

`GrpcConnection` is the asyncio protocol of one client connection. Each
turn of the event loop it hands h2 at most `max_frames_per_turn` frames,
`max_new_streams_per_turn` new streams and about `max_bytes_per_turn` bytes
(`FrameCounter`), turns h2's events into handler callbacks, and keeps every
resource of the connection bounded (see epp/transport/README.md for the
list and the reasoning):

- work per frame does not depend on the number of open streams: a
  stream's WINDOW_UPDATE pumps that stream's call; the connection's pumps
  the calls blocked on the connection window, in order, until that window
  is spent; a SETTINGS frame that raises the initial window pumps the calls
  blocked on their stream's window, and any other SETTINGS frame pumps
  none (`Outbound`, outbound.py);
- inbound: received DATA is acknowledged (its window handed back) while the
  connection holds at most `connection_buffer_bytes` (partial messages and
  unsent replies); above it the acknowledgements wait, so the client can
  send at most one connection window more;
- outbound: nothing is pumped while the transport has asked us to pause
  writing, and reading pauses with it, so a client that does not read
  cannot make the server queue replies to its PINGs and SETTINGS; a call
  holding more than `max_call_outbox_bytes` of unsent replies is reset;
- abuse: a high share of streams reset before their first message (rapid
  reset), too many control frames per second, or PINGs against the ping
  policy end the connection with GOAWAY ENHANCE_YOUR_CALM.

Each call ends exactly once: the handler ends it (`finish`), or it is told
`on_cancel` (the client reset it, the connection closed, or a limit ended
it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, cast

import h2.config
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from epp.transport.calls import Call, Handler, Route
from epp.transport.framing import FramingError, Status, prefix, trailers
from epp.transport.guards import Guards
from epp.transport.h2_internals import ServerH2Connection, goaway_frame
from epp.transport.outbound import Outbound
from epp.transport.turns import FrameCounter

if TYPE_CHECKING:
    from epp.transport.server import GrpcServer

log = logging.getLogger("epp.transport")

__all__ = ["Call", "FrameCounter", "GrpcConnection", "Handler", "Route"]
"""`Call`, `Handler`, `Route` (calls.py) and `FrameCounter` (turns.py) are
importable from here too."""

MAX_STREAM_ID = 2**31 - 1
LINGER_SECONDS = 1.0
"""How long a connection ended by a limit still reads (and drops) input."""
RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
PAUSED_FOR_TURN = 1
PAUSED_FOR_WRITES = 2


class GrpcConnection(asyncio.Protocol):
    """One HTTP/2 connection: its calls, by stream id."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server
        self._routes = server.routes
        limits = self.limits = server.limits
        self._h2 = ServerH2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_inbound_headers=False,  # h2_internals.header_list_error instead
                normalize_inbound_headers=False,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            ),
            max_streams=limits.max_concurrent_streams,
            max_header_list_bytes=limits.max_header_list_bytes,
        )
        self._transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        self.buffered = 0
        """Bytes held: partial inbound messages and unsent replies of all calls."""
        self._held_acks: dict[int, int] = {}
        self.idle = asyncio.Event()
        self.idle.set()
        self._receiving = False
        self._flush_soon: asyncio.Handle | None = None
        self._client_gone = False
        self._closed = False
        self._refused = False
        self._paused = 0
        self._backlog: bytes | None = None
        self._counter = FrameCounter()
        self._guards = Guards(limits)
        self._outbound = Outbound(self._h2, self._guards, self._finished)
        now = time.monotonic()
        self.made_at = now
        self.last_read = now
        self.idle_since: float | None = now
        self.ping_sent_at: float | None = None
        self.handshaken = False

    # -- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self._server
        if len(server.connections) >= server.max_connections:
            self._refused = True
            server.trip("max_connections")
            self._transport.close()
            return
        limits = self.limits
        codes = h2.settings.SettingCodes
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                codes.INITIAL_WINDOW_SIZE: limits.stream_window_bytes,
                codes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                codes.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
            },
        )
        self._h2.initiate_connection()
        window = limits.connection_window_bytes
        if window > self._h2.inbound_flow_control_window:
            self._h2.increment_flow_control_window(window - self._h2.inbound_flow_control_window)
        server.connections.add(self)
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self._refused or self._closed:
            return
        self.last_read = time.monotonic()
        if self._backlog is not None:
            self._backlog += data
            return
        self._flush()  # a GOAWAY in `data` would make h2 drop what is not yet written
        self._receive(data)

    def pause_writing(self) -> None:
        self._outbound.paused = True
        self._pause(PAUSED_FOR_WRITES)

    def resume_writing(self) -> None:
        self._outbound.paused = False
        self._resume(PAUSED_FOR_WRITES)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._refused:
            return
        self._server.connections.discard(self)
        self._cancel_all()

    # -- used by Call ------------------------------------------------------------

    def send_message(self, call: Call, payload: bytes) -> None:
        """Queue one message; the call's queued messages go out together, in
        as few DATA frames as flow control allows, when the turn's writes
        are flushed (a request's header and body replies make one frame)."""
        if len(payload) > self.limits.max_send_message_bytes:
            self._abort(
                call,
                Status.RESOURCE_EXHAUSTED,
                f"reply of {len(payload)} bytes over the limit of "
                f"{self.limits.max_send_message_bytes}",
            )
            return
        if not call.headers_sent:
            try:
                self._h2.send_headers(call.id, RESPONSE_HEADERS)
            except h2.exceptions.StreamClosedError:
                return  # reset by the client in the data being handled: its StreamReset follows
            call.headers_sent = True
            self._guards.sent_since_ping = True
        outbox = call._outbox
        outbox += prefix(len(payload))
        outbox += payload
        self.buffered += len(payload) + 5
        if len(outbox) > self.limits.max_call_outbox_bytes:
            self._server.trip("call_outbox")
            self._reset(call, CALM)
            return
        self._outbound.queue(call)
        self._flush_later()

    def finish(self, call: Call, status: Status, message: str) -> None:
        fields = trailers(status, message)
        if call.headers_sent:
            call._trailers = fields
            self._outbound.queue(call)
        else:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self._h2.send_headers(call.id, [*RESPONSE_HEADERS, *fields], end_stream=True)
            self._finished(call)
        self._flush_later()

    # -- shutdown and timers -------------------------------------------------------

    def go_away(self, error_code: int = 0) -> None:
        """Tell the client to open no more streams here; the open ones go on
        (the largest stream id, as RFC 9113 §6.8 suggests)."""
        if self._transport is not None and not self._closed:
            self._transport.write(goaway_frame(MAX_STREAM_ID, error_code))

    def close(self) -> None:
        """Close the connection; its open calls are cancelled at once."""
        self._cancel_all()
        self._flush()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def check_time(self, now: float) -> None:
        """Enforce the handshake deadline, the idle timeout and keepalive
        (the server calls this about once a second)."""
        limits = self.limits
        if not self.handshaken and now - self.made_at > limits.handshake_timeout:
            self._end("handshake_timeout", h2.errors.ErrorCodes.SETTINGS_TIMEOUT)
        elif self.idle_since is not None and now - self.idle_since > limits.idle_timeout:
            self._server.trip("idle_timeout")
            self.go_away()
            self.close()
        elif self.ping_sent_at is not None:
            if now - self.ping_sent_at > limits.keepalive_timeout:
                self._server.trip("keepalive_timeout")
                self.close()
        elif now - self.last_read > limits.keepalive_time:
            self.ping_sent_at = now
            self._h2.ping(b"epp-keep")
            self._flush()

    # -- reading ----------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        """Feed h2 this turn's share of `data` (`FrameCounter`), at once;
        keep the rest for the next turn and yield the loop."""
        limits = self.limits
        cut = self._counter.cut(
            data,
            limits.max_frames_per_turn,
            limits.max_new_streams_per_turn,
            limits.max_bytes_per_turn,
        )
        self._receiving = True
        try:
            try:
                events = self._h2.receive_data(data if cut == len(data) else data[:cut])
            except h2.exceptions.ProtocolError as error:
                self._protocol_error(error)
                return
            self._handle(events)
            if self._closed:
                return
            if cut < len(data):
                self._backlog = data[cut:]
                self._pause(PAUSED_FOR_TURN)
                asyncio.get_running_loop().call_soon(self._next_turn)
                self._server.trip("turn_yield")
        finally:
            self._receiving = False
        self._flush()

    def _next_turn(self) -> None:
        data, self._backlog = self._backlog, None
        self._resume(PAUSED_FOR_TURN)
        if data and not self._closed:
            self._receive(data)

    def _pause(self, reason: int) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused |= reason

    def _resume(self, reason: int) -> None:
        was = self._paused
        self._paused &= ~reason
        if was and not self._paused and self._transport is not None and not self._closed:
            self._transport.resume_reading()

    def _protocol_error(self, error: h2.exceptions.ProtocolError) -> None:
        log.warning("closing an HTTP/2 connection: %s", error)
        if isinstance(error, h2.exceptions.DenialOfServiceError):
            self._server.trip("header_block")
        self._linger_close(self._h2.data_to_send())

    def _handle(self, events: list[h2.events.Event]) -> None:
        received: dict[int, int] = {}
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                if event.flow_controlled_length:
                    stream_id = event.stream_id
                    received[stream_id] = received.get(stream_id, 0) + event.flow_controlled_length
                self._on_data(event)
            elif kind is h2.events.RequestReceived:
                self._on_request(event)
            elif kind is h2.events.StreamEnded:
                self._on_stream_ended(event.stream_id)
            elif kind is h2.events.StreamReset:
                self._on_reset(event)
            elif kind is h2.events.WindowUpdated:
                self._on_window_updated(event.stream_id)
            elif kind is h2.events.RemoteSettingsChanged:
                self._control_frame()
                window = event.changed_settings.get(h2.settings.SettingCodes.INITIAL_WINDOW_SIZE)
                if window is not None and window.new_value > (window.original_value or 0):
                    self._outbound.initial_window_raised()
            elif kind is h2.events.PingReceived:
                self._on_ping()
            elif kind is h2.events.PingAckReceived:
                self.ping_sent_at = None
            elif kind is h2.events.SettingsAcknowledged:
                self.handshaken = True
            elif kind is h2.events.PriorityUpdated:
                self._control_frame()
            elif kind is h2.events.ConnectionTerminated:
                self._on_go_away()
            if self._closed:
                return
        for stream_id, size in received.items():
            self._acknowledge(stream_id, size)

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        self._guards.stream_opened()
        headers = dict(event.headers or ())
        content_type = headers.get(b"content-type", b"")
        if not content_type.startswith(b"application/grpc"):
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self._h2.send_headers(stream_id, [(b":status", b"415")], end_stream=True)
            return
        call = Call(self, stream_id, self.limits.max_receive_message_bytes)
        path = headers.get(b":path", b"").decode("latin-1")
        route = self._routes.get(path)
        if route is None:
            call.closed = True
            self.finish(call, Status.UNIMPLEMENTED, "unknown method")
            return
        self.calls[stream_id] = call
        self.idle.clear()
        self.idle_since = None
        try:
            call.handler = route(call)
        except Exception:
            log.exception("%s: the handler could not start", path)
            self._abort(call, Status.INTERNAL, "internal error")

    def _on_data(self, event: h2.events.DataReceived) -> None:
        data = event.data
        if not data and event.stream_ended is None:
            self._control_frame()
        call = self.calls.get(event.stream_id)
        if call is None or call.closed:
            return
        reader = call.reader
        before = reader.held
        try:
            messages = reader.feed(data)
        except FramingError as error:
            self.buffered -= before
            self._abort(call, error.status, error.message)
            return
        if before or reader.held:
            self.buffered += reader.held - before
        for message in messages:
            call.delivered = True
            self._deliver(call, "on_message", message)
            if call.closed:
                return

    def _on_stream_ended(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.closed:
            return
        if call.reader.held:
            self._abort(call, Status.INTERNAL, "the stream ended inside a message")
            return
        self._deliver(call, "on_half_close")

    def _on_go_away(self) -> None:
        """The client opens no more streams here; the open ones may finish."""
        self._client_gone = True
        if not self.calls:
            self.close()

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        call = self.calls.pop(event.stream_id, None)
        if call is None:
            return
        if event.remote_reset and not call.delivered and self._guards.too_many_premature_resets():
            self._cancel(call)
            self._end("premature_resets", CALM)
            return
        self._cancel(call)
        self._call_removed()

    def _on_window_updated(self, stream_id: int) -> None:
        if self._guards.window_update():
            self._end("control_frames", CALM)
        if stream_id:
            call = self.calls.get(stream_id)
            if call is not None:
                self._outbound.stream_window_opened(call)

    def _on_ping(self) -> None:
        """grpc-go's ping policy: a PING within `min_ping_interval` of the
        previous one, with nothing sent in between, is a strike."""
        self._control_frame()
        if self._guards.ping_strikes_out():
            self._end("ping_strikes", CALM)

    def _control_frame(self) -> None:
        """Count a control frame; more than the limit within a second ends
        the connection."""
        if self._guards.control_frame():
            self._end("control_frames", CALM)

    def _end(self, limit: str, error_code: int) -> None:
        """A limit ends the connection: GOAWAY with `error_code`, then close."""
        if self._closed:
            return
        log.warning("closing an HTTP/2 connection: over the %s limit", limit)
        self._server.trip(limit)
        last_stream_id = self._h2.highest_inbound_stream_id
        self._linger_close(self._h2.data_to_send() + goaway_frame(last_stream_id, error_code))

    def _linger_close(self, last_words: bytes) -> None:
        """Write `last_words` (a GOAWAY), stop sending, and close after
        `LINGER_SECONDS` of reading and discarding what the client still
        sends: closing at once, with unread data, would make the kernel
        answer RST, and the client might never read the GOAWAY."""
        self._cancel_all()
        self._closed = True
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(last_words)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._paused = 0
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    # -- flow control -------------------------------------------------------------------

    def _acknowledge(self, stream_id: int, size: int) -> None:
        """Hand `size` received bytes back to the client's windows, unless
        the connection holds more than its budget: then once it drains."""
        if self.buffered <= self.limits.connection_buffer_bytes and not self._held_acks:
            self._h2.acknowledge_received_data(size, stream_id)
            return
        if not self._held_acks:
            self._server.trip("connection_buffer")
        self._held_acks[stream_id] = self._held_acks.get(stream_id, 0) + size

    def _release_acks(self) -> None:
        held, self._held_acks = self._held_acks, {}
        for stream_id, size in held.items():
            self._h2.acknowledge_received_data(size, stream_id)

    # -- writing ---------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_soon = None
        transport = None if self._closed else self._transport
        self.buffered -= self._outbound.pump_ready(transport.write if transport else None)
        if self._held_acks and self.buffered <= self.limits.connection_buffer_bytes:
            self._release_acks()
        data = self._h2.data_to_send()
        if data and transport is not None:
            transport.write(data)

    def _flush_later(self) -> None:
        """One write for everything sent in this turn of the event loop
        (data_received flushes its own at its end)."""
        if not self._receiving and self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self._flush)

    # -- ending calls ------------------------------------------------------------------

    def _deliver(self, call: Call, callback: str, *args: bytes) -> None:
        """Run a handler callback; an exception ends the call with INTERNAL."""
        try:
            getattr(call.handler, callback)(*args)
        except Exception:
            log.exception("stream %d: the handler failed", call.id)
            self._abort(call, Status.INTERNAL, "internal error")

    def _abort(self, call: Call, status: Status, message: str) -> None:
        """End a call from this side: the client gets `status`, the handler
        (unless it had ended the call itself) `on_cancel`."""
        if call.closed:
            return
        handler, call.handler = call.handler, None
        self._drop_inbound(call)
        call.finish(status, message)
        self._tell_cancelled(call, handler)

    def _reset(self, call: Call, error_code: int) -> None:
        """End a call with RST_STREAM: what it had queued is dropped."""
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.reset_stream(call.id, error_code)
        if self.calls.pop(call.id, None) is not None:
            self._cancel(call)
            self._call_removed()
        else:
            self._drop(call)

    def _cancel(self, call: Call) -> None:
        handler, call.handler = call.handler, None
        self._drop(call)
        if not call.closed:
            call.closed = True
            self._tell_cancelled(call, handler)

    def _cancel_all(self) -> None:
        calls, self.calls = self.calls, {}
        for call in calls.values():
            self._cancel(call)
        self.idle.set()

    def _tell_cancelled(self, call: Call, handler: Handler | None) -> None:
        """Tell the handler the call was cancelled. (Its callers have taken
        the handler from the call: the two refer to each other, and a cycle
        per request would be left to the garbage collector, whose passes then
        stall the event loop for tens of milliseconds.)"""
        if handler is not None:
            try:
                handler.on_cancel()
            except Exception:
                log.exception("stream %d: the handler failed on cancel", call.id)

    def _drop_inbound(self, call: Call) -> None:
        if call.reader.held:
            self.buffered -= call.reader.clear()

    def _drop(self, call: Call) -> None:
        """Forget what the call holds: its partial message and unsent replies."""
        self._drop_inbound(call)
        self.buffered -= len(call._outbox)
        call._outbox.clear()
        call._trailers = None
        self._outbound.forget(call)

    def _call_removed(self) -> None:
        if not self.calls:
            self.idle.set()
            self.idle_since = time.monotonic()
            if self._client_gone:
                self.close()

    def _finished(self, call: Call) -> None:
        """Our side is done: stop the client's side too if it is still sending
        (RFC 9113 §8.1: RST_STREAM NO_ERROR after a complete response)."""
        call.handler = None
        self._drop(call)
        if self.calls.pop(call.id, None) is not None:
            self._call_removed()
        stream = self._h2.streams.get(call.id)
        if stream is not None and stream.open:
            self._h2.reset_stream(call.id, h2.errors.ErrorCodes.NO_ERROR)
