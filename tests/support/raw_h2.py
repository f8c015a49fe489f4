"""A raw HTTP/2 client on a blocking socket (h2 and hyperframe), for floods
and limits no gRPC client will produce, and a prober that keeps a
well-behaved grpcio client checking health meanwhile. Both run in threads,
so that the server's event loop, in the test's thread, is measured alone.
`request_headers`, `headers_frame` and `split_frames` also serve
`bench.transport_limits`' client, which keeps no h2 state for what it reads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterable

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
)

from tests.support.grpc_handlers import ECHO, SINK

HEALTH_P99_LIMIT = 0.1


def request_headers(
    path: str = ECHO, extra: Iterable[tuple[str, str]] = (), authority: str = "test"
) -> list:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        *extra,
    ]


def headers_frame(
    encoder: Encoder,
    stream_id: int,
    headers: list,
    *,
    end_headers: bool = True,
    end_stream: bool = False,
) -> bytes:
    """A HEADERS frame coded with `encoder` (the connection's one HPACK table)."""
    frame = HeadersFrame(stream_id, data=encoder.encode(headers))
    if end_stream:
        frame.flags.add("END_STREAM")
    if end_headers:
        frame.flags.add("END_HEADERS")
    return frame.serialize()


def split_frames(raw: bytearray) -> list[Frame]:
    """The whole frames at the front of `raw`, taken off it (a partial one stays)."""
    frames = []
    while len(raw) >= 9:
        frame, length = Frame.parse_frame_header(memoryview(raw[:9]))
        if len(raw) < 9 + length:
            break
        frame.parse_body(memoryview(raw[9 : 9 + length]))
        del raw[: 9 + length]
        frames.append(frame)
    return frames


def message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class RawH2:
    """One client connection. `send_raw` writes bytes as they are; the h2
    state machine (`h2`) is used for frames it will produce."""

    def __init__(
        self,
        port: int,
        settings: dict | None = None,
        *,
        preface: bool = True,
        receive_buffer: int | None = None,
    ) -> None:
        self.sock = socket.socket()
        if receive_buffer is not None:  # before connecting, so the TCP window is small too
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(5)
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.closed = False
        self.events: list[h2.events.Event] = []
        self.frames: list[Frame] = []
        """Every frame received, parsed apart from h2 (which gives up on
        frames for streams it did not open itself)."""
        self._raw = bytearray()
        self._h2_failed = False
        self._pings = 0
        self.silent = not preface
        """Sends nothing at all (not even h2's answers to the server's frames)."""
        if preface:
            self.h2.initiate_connection()
            if settings:
                self.h2.update_settings(settings)
            self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if not self.silent:
            self.send_raw(data)

    def send_raw(self, data: bytes) -> None:
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def open(self, stream_id: int, path: str = ECHO, payload: bytes | None = None) -> None:
        self.h2.send_headers(stream_id, request_headers(path))
        if payload is not None:
            self.h2.send_data(stream_id, message(payload))
        self.flush()

    def headers_frame(
        self, stream_id: int, headers: list, *, end_headers: bool = True, end_stream: bool = False
    ) -> bytes:
        """A HEADERS frame coded with h2's own encoder (one HPACK table)."""
        return headers_frame(
            self.h2.encoder, stream_id, headers, end_headers=end_headers, end_stream=end_stream
        )

    def read(self, timeout: float = 0.2) -> list[h2.events.Event]:
        """The events of what arrives within `timeout` (none on EOF)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        self._parse_frames(data)
        if self._h2_failed:
            return []
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._h2_failed = True
            return []
        self.events.extend(events)
        self.flush()
        return events

    def _parse_frames(self, data: bytes) -> None:
        raw = self._raw
        raw += data
        if not self.frames and not self.events and raw.startswith(b"PRI"):
            del raw[:24]
        self.frames.extend(split_frames(raw))

    def wait_for_frame(self, kind: type, stream_id: int, timeout: float = 5.0) -> Frame | None:
        """The first frame of `kind` on `stream_id` received, or None."""
        deadline = time.monotonic() + timeout
        while True:
            for frame in self.frames:
                if isinstance(frame, kind) and frame.stream_id == stream_id:
                    return frame
            if self.closed or time.monotonic() > deadline:
                return None
            self.read()

    def wait_for(self, kind: type, timeout: float = 5.0, stream_id: int | None = None):
        """The first event of `kind` (on `stream_id`), or None once the
        connection is closed or `timeout` passes."""
        deadline = time.monotonic() + timeout
        for event in self.events:
            if isinstance(event, kind) and stream_id in (None, getattr(event, "stream_id", None)):
                return event
        while not self.closed and time.monotonic() < deadline:
            for event in self.read():
                if isinstance(event, kind) and stream_id in (
                    None,
                    getattr(event, "stream_id", None),
                ):
                    return event
        return None

    def round_trip(self, timeout: float = 5.0) -> bool:
        """Send a PING and wait for its ACK (False: none came). The server
        handles frames in order, so once it answers it has handled every
        frame sent before."""
        self._pings += 1
        opaque = self._pings.to_bytes(8, "big")
        self.send_raw(PingFrame(0, opaque_data=opaque).serialize())
        deadline = time.monotonic() + timeout
        while True:
            for frame in self.frames:
                if (
                    isinstance(frame, PingFrame)
                    and "ACK" in frame.flags
                    and frame.opaque_data == opaque
                ):
                    return True
            if self.closed or time.monotonic() > deadline:
                return False
            self.read()

    def wait_closed(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self.read()
        return self.closed

    def goaway(self, timeout: float = 5.0) -> GoAwayFrame | None:
        return self.wait_for_frame(GoAwayFrame, 0, timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def send_message(client: RawH2, stream_id: int, payload: bytes) -> None:
    """One message in frames of at most 16 KiB, past h2's flow control
    bookkeeping (the server's windows are what is tested)."""
    data = message(payload)
    for start in range(0, len(data), 16_384):
        client.send_raw(DataFrame(stream_id, data=data[start : start + 16_384]).serialize())


def new_streams(client: RawH2, first_stream: int, count: int, path: str = SINK) -> bytes:
    """HEADERS opening `count` streams, built without h2's per-stream bookkeeping."""
    out = bytearray()
    for stream_id in range(first_stream, first_stream + 2 * count, 2):
        out += client.headers_frame(stream_id, request_headers(path))
    return bytes(out)


def rapid_reset_pairs(client: RawH2, first_stream: int, count: int) -> bytes:
    out = bytearray()
    for stream_id in range(first_stream, first_stream + 2 * count, 2):
        out += client.headers_frame(stream_id, request_headers(SINK))
        out += RstStreamFrame(stream_id, error_code=8).serialize()
    return bytes(out)


def continuation_frames(client: RawH2, stream_id: int, count: int, size: int) -> bytes:
    out = bytearray(client.headers_frame(stream_id, request_headers(SINK), end_headers=False))
    for _ in range(count):
        out += ContinuationFrame(stream_id, data=b"\x00" * size).serialize()
    return bytes(out)


class HealthProber:
    """A grpcio client checking health every few milliseconds in a thread."""

    def __init__(self, port: int, interval: float = 0.005) -> None:
        self.port = port
        self.interval = interval
        self.latencies: list[float] = []
        self.failures = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="liveness")
            stub.Check(request, timeout=5)  # connected before the clock starts
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    stub.Check(request, timeout=1)
                except grpc.RpcError as error:
                    self.failures += 1
                    self.errors.append(f"{error.code()}: {error.details()}")
                self.latencies.append(time.perf_counter() - start)
                time.sleep(self.interval)

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HealthProber]:
        """Probing while the block runs; the last check is awaited off the
        event loop, which must go on serving it."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.to_thread(self._thread.join, 10)
