"""A gRPC server over HTTP/2 on the asyncio event loop, with h2.

It serves the ext_proc port. grpc.aio cost the EPP about 1 ms of CPU per
HTTP request behind Envoy (an ext_proc stream carries 6 messages each way
and every read and write is a completion-queue round trip through gRPC's
poller thread); with this server, in the event loop's own thread, the whole
EPP costs about 300 µs per request, and each message is handed over without
a thread hop (measured in bench/extproc_e2e.py).

What it implements is what Envoy's ext_proc client and gRPC health probes
use: calls of any cardinality (a unary call is a stream with one message
each way), identity encoding, length-prefixed messages, HTTP/2 flow control
in both directions, trailers with `grpc-status`, RST_STREAM as cancellation,
a graceful GOAWAY on shutdown, TLS with ALPN `h2`. Compressed messages are
refused with UNIMPLEMENTED (Envoy does not compress ext_proc messages).

Handlers are plain callbacks run on the event loop: `route(call)` makes one
per call; it gets `on_message`, `on_half_close` (the client sent its last
message) and `on_cancel` (the client reset the stream or the connection
dropped), and answers through `call.send` and `call.finish`. Each call ends
with exactly one of `finish` or `on_cancel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Hashable, Iterable, Mapping
from enum import IntEnum
from typing import Protocol, cast
from urllib.parse import quote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack
from hyperframe.frame import Frame, GoAwayFrame, RstStreamFrame

log = logging.getLogger(__name__)

PREFIX_BYTES = 5
"""A message's prefix: 1 byte compressed flag, 4 bytes big-endian length."""
MAX_STREAM_ID = 2**31 - 1
STREAM_WALK_SLACK = 64
RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))


class Status(IntEnum):
    """gRPC status codes (the ones this server and its handlers use)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class Handler(Protocol):
    def on_message(self, payload: bytes) -> None: ...

    def on_half_close(self) -> None: ...

    def on_cancel(self) -> None: ...


Route = Callable[["Call"], Handler]
"""Makes the handler of one call to a method (routes are keyed by `/package.Service/Method`)."""


class Call:
    """One gRPC call, as its handler sees it."""

    __slots__ = ("_connection", "_outbox", "_trailers", "closed", "handler", "headers_sent", "id")

    def __init__(self, connection: GrpcConnection, stream_id: int) -> None:
        self._connection = connection
        self.id = stream_id
        self.handler: Handler | None = None
        self.headers_sent = False
        self.closed = False
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


class StateMemo:
    """Results of a header coder, each valid while the coder is in the state
    it was computed in. Only results whose computation left that state
    unchanged are kept (a coding that changed it would change it again)."""

    SIZE = 64

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[tuple, object]] = {}

    def get(self, key: Hashable, state: tuple) -> object | None:
        entry = self._entries.get(key)
        return entry[1] if entry is not None and entry[0] == state else None

    def keep(self, key: Hashable, before: tuple, after: tuple, result: object) -> None:
        if before != after:
            return
        if len(self._entries) >= self.SIZE:
            self._entries.clear()
        self._entries[key] = (before, result)


class RepeatedBlockDecoder(hpack.Decoder):
    """hpack's decoder, remembering the header blocks that leave its state as
    they found it.

    Envoy opens every ext_proc stream with the same header block, whose
    `:path` is a Huffman-coded literal that hpack decodes bit by bit in Python
    (~6% of the server's CPU per request). What a block decodes to depends
    only on the block and the decoder's state (its dynamic table and size
    limits), so a block that changed none of that decodes to the same headers
    whenever the state is the same again."""

    def __init__(self) -> None:
        super().__init__()
        self._memo = StateMemo()

    def _state(self) -> tuple:
        return (
            tuple(self.header_table.dynamic_entries),
            self.header_table_size,
            self.max_allowed_table_size,
            self.max_header_list_size,
        )

    def decode(self, data: bytes, raw: bool = False) -> list:
        key = (bytes(data), raw)
        state = self._state()
        headers = self._memo.get(key, state)
        if headers is None:
            headers = list(super().decode(data, raw))
            self._memo.keep(key, state, self._state(), headers)
        return list(headers)


class RepeatedBlockEncoder(hpack.Encoder):
    """hpack's encoder, remembering the header lists whose encoding leaves its
    state as it found it: every call sends the same response headers and,
    mostly, the same trailers, which hpack would look up in its tables field
    by field each time. Only lists of plain tuples are remembered (a
    `HeaderTuple` carries its indexing in its type)."""

    def __init__(self) -> None:
        super().__init__()
        self._memo = StateMemo()

    def _state(self) -> tuple:
        table = self.header_table
        return (tuple(table.dynamic_entries), table.maxsize, table.resized)

    def encode(self, headers: Iterable | dict, huffman: bool = True) -> bytes:
        if isinstance(headers, dict):
            return super().encode(headers, huffman)
        headers = tuple(headers)
        if any(type(header) is not tuple for header in headers):
            return super().encode(headers, huffman)
        key = (headers, huffman)
        state = self._state()
        block = self._memo.get(key, state)
        if block is None:
            block = super().encode(headers, huffman)
            self._memo.keep(key, state, self._state(), block)
        return block


class _ServerH2Connection(h2.connection.H2Connection):
    """h2's connection with two changes for a server holding thousands of
    streams (every queued request is an open ext_proc stream):

    - counting the open streams, which h2 does for each new stream by walking
      all of them (and dropping the closed ones), is done only when the
      stream table has doubled since the last walk; in between the table's
      size stands for the count (an upper bound). Measured: a new stream cost
      0.47 ms with 1,000 open and 1.3 ms with 5,000, against 0.15 ms with 10;
    - a GOAWAY from the client leaves the connection open: the streams the
      client already opened may still finish (RFC 9113 §6.8), and h2 would
      refuse to send anything more on them.

    And three for speed: no trace formatting of every received frame, and an
    encoder and a decoder that remember repeated header blocks.
    """

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        self._streams_after_walk = 0
        self.encoder = RepeatedBlockEncoder()
        self.decoder = RepeatedBlockDecoder()
        self.decoder.max_header_list_size = self.DEFAULT_MAX_HEADER_LIST_SIZE

    @property
    def open_inbound_streams(self) -> int:
        if len(self.streams) < 2 * self._streams_after_walk + STREAM_WALK_SLACK:
            return len(self.streams)
        count = super().open_inbound_streams
        self._streams_after_walk = len(self.streams)
        return count

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        """h2's own, less its trace log of `repr(frame)`, which it formats for
        every frame received even when nothing logs it: ~8% of the server's
        CPU per ext_proc request (6 frames in, each a hex dump). The error
        handling is h2's (4.x), line for line."""
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as error:
            if not self._stream_is_closed_by_reset(error.stream_id):
                raise
            reset = RstStreamFrame(error.stream_id)
            reset.error_code = error.error_code
            self._prepare_for_sending([reset])
            return error._events
        except h2.exceptions.StreamIDTooLowError as error:
            if self._stream_is_closed_by_reset(error.stream_id):
                reset = RstStreamFrame(error.stream_id)
                reset.error_code = h2.errors.ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([reset])
                return []
            if self._stream_is_closed_by_end(error.stream_id):
                raise h2.exceptions.StreamClosedError(error.stream_id) from error
            raise
        self._prepare_for_sending(frames)
        return events

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list, list]:
        frames, events = super()._receive_goaway_frame(frame)
        self.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN
        return frames, events


class GrpcConnection(asyncio.Protocol):
    """One HTTP/2 connection: its calls, by stream id."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server
        self._routes = server.routes
        self._max_message_bytes = server.max_message_bytes
        self._h2 = _ServerH2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self._transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        self._unsent: dict[Call, None] = {}
        """Calls with messages or trailers to send at the next flush, in order."""
        self._buffers: dict[int, bytearray] = {}
        self.idle = asyncio.Event()
        self.idle.set()
        self._receiving = False
        self._flush_soon: asyncio.Handle | None = None
        self._client_gone = False

    # -- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        window = self._server.window_bytes
        self._h2.local_settings = h2.settings.Settings(
            client=False, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(window - self._h2.inbound_flow_control_window)
        self._server.connections.add(self)
        self._flush()

    def data_received(self, data: bytes) -> None:
        self._flush()  # a GOAWAY in `data` would make h2 drop what is not yet written
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            log.warning("closing an HTTP/2 connection: %s", error)
            self._flush()
            self.close()
            return
        self._receiving = True
        try:
            self._handle(events)
        finally:
            self._receiving = False
        self._flush()

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
                self._on_reset(event.stream_id)
            elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
                self._pump_all()
            elif kind is h2.events.ConnectionTerminated:
                self._on_go_away()
        for stream_id, size in received.items():
            self._h2.acknowledge_received_data(size, stream_id)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._cancel_all()

    def _cancel_all(self) -> None:
        calls, self.calls = self.calls, {}
        for call in calls.values():
            self._cancel(call)
        self.idle.set()

    # -- used by Call ------------------------------------------------------------

    def send_message(self, call: Call, payload: bytes) -> None:
        """Queue one message; the call's queued messages go out together, in
        as few DATA frames as flow control allows, when the turn's writes
        are flushed (a request's header and body replies make one frame)."""
        if not call.headers_sent:
            try:
                self._h2.send_headers(call.id, RESPONSE_HEADERS)
            except h2.exceptions.StreamClosedError:
                return  # reset by the client in the data being handled: its StreamReset follows
            call.headers_sent = True
        outbox = call._outbox
        outbox += b"\x00"  # not compressed
        outbox += len(payload).to_bytes(4, "big")
        outbox += payload
        self._unsent[call] = None
        self._flush_later()

    def finish(self, call: Call, status: Status, message: str) -> None:
        trailers = [(b"grpc-status", b"%d" % status)]
        if message:
            trailers.append((b"grpc-message", quote(message, safe=" ").encode()))
        if call.headers_sent:
            call._trailers = trailers
            self._unsent[call] = None
        else:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self._h2.send_headers(call.id, [*RESPONSE_HEADERS, *trailers], end_stream=True)
            self._finished(call)
        self._flush_later()

    # -- shutdown ------------------------------------------------------------------

    def go_away(self) -> None:
        """Tell the client to open no more streams here; the open ones go on.
        (h2's own GOAWAY would close its state machine, so this one is written
        by hand, with the largest stream id, as RFC 9113 §6.8 suggests.)"""
        if self._transport is not None and not self._transport.is_closing():
            frame = GoAwayFrame(stream_id=0, last_stream_id=MAX_STREAM_ID, error_code=0)
            self._transport.write(frame.serialize())

    def close(self) -> None:
        """Close the connection; its open calls are cancelled at once."""
        self._cancel_all()
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # -- internals -------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_soon = None
        if self._unsent:
            unsent, self._unsent = self._unsent, {}
            for call in unsent:
                self._pump(call)
        data = self._h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _flush_later(self) -> None:
        """One write for everything sent in this turn of the event loop
        (data_received flushes its own at its end)."""
        if not self._receiving and self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self._flush)

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        headers = dict(event.headers or ())
        path = headers.get(b":path", b"").decode("latin-1")
        content_type = headers.get(b"content-type", b"")
        if not content_type.startswith(b"application/grpc"):
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self._h2.send_headers(stream_id, [(b":status", b"415")], end_stream=True)
            return
        route = self._routes.get(path)
        call = Call(self, stream_id)
        if route is None:
            call.closed = True
            self.finish(call, Status.UNIMPLEMENTED, f"unknown method {path}")
            return
        self.calls[stream_id] = call
        self.idle.clear()
        try:
            call.handler = route(call)
        except Exception:
            log.exception("%s: the handler could not start", path)
            self._abort(call, Status.INTERNAL, "internal error")

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id
        call = self.calls.get(stream_id)
        if call is None or call.closed:
            return
        buffer = self._buffers.get(stream_id)
        data = event.data
        if buffer is not None:
            buffer += data
            data = bytes(buffer)
        offset = 0
        while len(data) - offset >= PREFIX_BYTES:
            length = int.from_bytes(data[offset + 1 : offset + PREFIX_BYTES], "big")
            if data[offset]:
                self._abort(call, Status.UNIMPLEMENTED, "compressed messages are not supported")
                return
            if length > self._max_message_bytes:
                self._abort(
                    call,
                    Status.RESOURCE_EXHAUSTED,
                    f"message of {length} bytes over the limit of {self._max_message_bytes}",
                )
                return
            end = offset + PREFIX_BYTES + length
            if len(data) < end:
                break
            self._deliver(call, "on_message", data[offset + PREFIX_BYTES : end])
            if call.closed:
                return
            offset = end
        if offset < len(data):
            self._buffers[stream_id] = bytearray(data[offset:])
        elif buffer is not None:
            del self._buffers[stream_id]

    def _on_stream_ended(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.closed:
            return
        if self._buffers.pop(stream_id, None):
            self._abort(call, Status.INTERNAL, "the stream ended inside a message")
            return
        self._deliver(call, "on_half_close")

    def _on_go_away(self) -> None:
        """The client opens no more streams here; the open ones may finish."""
        self._client_gone = True
        if not self.calls:
            self.close()

    def _on_reset(self, stream_id: int) -> None:
        call = self.calls.pop(stream_id, None)
        self._buffers.pop(stream_id, None)
        if call is not None:
            self._cancel(call)
            self._call_removed()

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
        call.finish(status, message)
        self._tell_cancelled(call, handler)

    def _cancel(self, call: Call) -> None:
        handler, call.handler = call.handler, None
        if not call.closed:
            call.closed = True
            self._tell_cancelled(call, handler)

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

    def _pump(self, call: Call) -> None:
        """Send what flow control lets through now; the trailers once all is out."""
        h2_connection = self._h2
        outbox = call._outbox
        try:
            while outbox:
                size = min(
                    len(outbox),
                    h2_connection.local_flow_control_window(call.id),
                    h2_connection.max_outbound_frame_size,
                )
                if size <= 0:
                    return
                h2_connection.send_data(call.id, bytes(outbox[:size]))
                del outbox[:size]
            if call._trailers is not None:
                h2_connection.send_headers(call.id, call._trailers, end_stream=True)
                self._finished(call)
        except h2.exceptions.StreamClosedError:
            self._finished(call)

    def _call_removed(self) -> None:
        if not self.calls:
            self.idle.set()
            if self._client_gone:
                self.close()

    def _pump_all(self) -> None:
        for call in list(self.calls.values()):
            if call._outbox or call._trailers is not None:
                self._pump(call)

    def _finished(self, call: Call) -> None:
        """Our side is done: stop the client's side too if it is still sending
        (RFC 9113 §8.1: RST_STREAM NO_ERROR after a complete response)."""
        call._trailers = None
        call.handler = None
        self._buffers.pop(call.id, None)
        if self.calls.pop(call.id, None) is not None:
            self._call_removed()
        stream = self._h2.streams.get(call.id)
        if stream is not None and stream.open:
            self._h2.reset_stream(call.id, h2.errors.ErrorCodes.NO_ERROR)


class GrpcServer:
    """Listens, keeps its connections, and shuts down gracefully."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        max_message_bytes: int = 4 * 1024 * 1024,
        window_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.routes = dict(routes)
        self.max_message_bytes = max_message_bytes
        self.window_bytes = window_bytes
        self.connections: set[GrpcConnection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on `host:port` (0: a free port); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GrpcConnection(self), host, port, ssl=ssl_context
        )
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None) -> None:
        """Stop listening, send GOAWAY, give open calls up to `grace` seconds
        (None: none) to finish, then close every connection."""
        if self._server is not None:
            self._server.close()
        connections = list(self.connections)
        for connection in connections:
            connection.go_away()
        if grace and connections:
            waits = [asyncio.ensure_future(c.idle.wait()) for c in connections]
            _, pending = await asyncio.wait(waits, timeout=grace)
            for wait in pending:
                wait.cancel()
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
