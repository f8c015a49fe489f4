"""Every flood and limit of epp.transport, driven by a raw h2 client, while a
well-behaved grpcio client's health checks (on the health port, served by
the same event loop) keep their p99 under 100 ms."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import h2.errors
import h2.events
import h2.settings
import pytest
from hyperframe.frame import (
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from epp.serve.health import Health
from epp.serve.tls import server_ssl_context
from epp.transport import HEALTH_LIMITS, GrpcServer, TransportLimits
from epp.transport.connection import GrpcConnection
from epp.transport.outbound import Outbound
from tests.support.grpc_handlers import ECHO, SINK, Echo, Sink
from tests.support.raw_h2 import (
    HEALTH_P99_LIMIT,
    HealthProber,
    RawH2,
    continuation_frames,
    message,
    new_streams,
    rapid_reset_pairs,
    request_headers,
    send_message,
)
from tests.support.waiting import eventually

T = TypeVar("T")
CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
MIB = 1024 * 1024


@dataclass(slots=True)
class Stack:
    grpc: GrpcServer
    port: int
    health_port: int
    log: list[str]

    def connection(self) -> GrpcConnection:
        assert len(self.grpc.connections) == 1, dict(self.grpc.trips)
        return next(iter(self.grpc.connections))


@contextlib.asynccontextmanager
async def serving(limits: TransportLimits | None = None) -> AsyncIterator[Stack]:
    log: list[str] = []
    health = Health()
    await health.start()
    await health.set_ready()
    routes = {
        ECHO: lambda call: Echo(call, log),
        SINK: lambda call: Sink(call, log),
        **health.routes(),
    }
    server = GrpcServer(routes, limits=limits or TransportLimits())
    health_server = GrpcServer(health.routes(), limits=HEALTH_LIMITS)
    port = await server.start("127.0.0.1", 0)
    health_port = await health_server.start("127.0.0.1", 0)
    gc.collect()
    gc.freeze()  # as epp serve does once started: collections skip what the suite left
    try:
        yield Stack(server, port, health_port, log)
    finally:
        gc.unfreeze()
        await server.stop(None)
        await health_server.stop(None)


async def while_probing(stack: Stack, flood: Callable[[], T], least: float = 0.5) -> T:
    """Run `flood` in a thread while health is checked; its result once the
    health p99 over the run (at least `least` seconds) is checked."""
    prober = HealthProber(stack.health_port)
    async with prober.running():
        start = time.monotonic()
        result = await asyncio.to_thread(flood)
        await asyncio.sleep(max(0.0, least - (time.monotonic() - start)))
    assert len(prober.latencies) >= 5
    assert prober.failures == 0, prober.errors
    assert prober.p99() < HEALTH_P99_LIMIT
    return result


async def goaway_for(stack: Stack, frames: Callable[[RawH2], bytes]) -> GoAwayFrame | None:
    """The GOAWAY a new connection gets for the bytes `frames` builds, sent at
    once, while health is checked (`while_probing`)."""

    def flood() -> GoAwayFrame | None:
        client = RawH2(stack.port)
        client.send_raw(frames(client))
        return client.goaway()

    return await while_probing(stack, flood)


# -- abuse: GOAWAY ENHANCE_YOUR_CALM -------------------------------------------------


async def test_rapid_reset_gets_goaway_enhance_your_calm():
    async with serving() as stack:

        def flood() -> GoAwayFrame | None:
            client = RawH2(stack.port)
            for batch in range(20):
                client.send_raw(rapid_reset_pairs(client, 1 + 2 * 200 * batch, 200))
                client.read(0.01)
                if client.closed or any(isinstance(f, GoAwayFrame) for f in client.frames):
                    break
            return client.goaway()

        goaway = await while_probing(stack, flood)
    assert goaway is not None and goaway.error_code == CALM
    assert stack.grpc.trips["premature_resets"] == 1
    assert goaway.last_stream_id < 2 * 1_000


async def test_streams_reset_after_their_first_message_are_not_rapid_reset():
    async with serving(TransportLimits(premature_reset_min_streams=20)) as stack:

        def cancel_after_a_message() -> bool:
            client = RawH2(stack.port)
            for stream_id in range(1, 81, 2):
                client.open(stream_id, ECHO, b"x")
                assert client.wait_for(h2.events.DataReceived, stream_id=stream_id)
                client.h2.reset_stream(stream_id)
                client.flush()
            return client.closed or client.goaway(0.2) is not None

        assert not await while_probing(stack, cancel_after_a_message)
    assert stack.grpc.trips["premature_resets"] == 0


@pytest.mark.parametrize(
    "frame",
    [
        PingFrame(0, opaque_data=b"12345678").serialize(),
        SettingsFrame(0).serialize(),
        WindowUpdateFrame(0, window_increment=1).serialize(),
    ],
    ids=["ping", "settings", "window_update"],
)
async def test_control_frame_flood_gets_goaway_enhance_your_calm(frame):
    limits = TransportLimits(max_ping_strikes=10**9)
    async with serving(limits) as stack:
        goaway = await goaway_for(stack, lambda client: frame * 3_000)
    assert goaway is not None and goaway.error_code == CALM
    assert stack.grpc.trips["control_frames"] == 1


async def test_empty_data_frames_count_as_control_frames():
    async with serving() as stack:
        goaway = await goaway_for(
            stack,
            lambda client: (
                client.headers_frame(1, request_headers(SINK))
                + DataFrame(1, data=b"").serialize() * 3_000
            ),
        )
    assert goaway is not None and goaway.error_code == CALM


async def test_pings_against_the_ping_policy_get_goaway_enhance_your_calm():
    async with serving() as stack:

        def pings() -> GoAwayFrame | None:
            client = RawH2(stack.port)
            for _ in range(4):
                client.h2.ping(b"12345678")
                client.flush()
                client.wait_for(h2.events.PingAckReceived, 1)
            return client.goaway()

        goaway = await while_probing(stack, pings)
    assert goaway is not None and goaway.error_code == CALM
    assert stack.grpc.trips["ping_strikes"] == 1


# -- limits on streams and headers ---------------------------------------------------


async def test_a_stream_over_the_limit_is_refused_and_the_connection_goes_on():
    async with serving(TransportLimits(max_concurrent_streams=10)) as stack:

        def open_eleven() -> tuple[object, object]:
            client = RawH2(stack.port)
            client.send_raw(new_streams(client, 1, 11))
            refused = client.wait_for_frame(RstStreamFrame, 21)
            client.send_raw(RstStreamFrame(1, error_code=8).serialize())
            client.send_raw(client.headers_frame(23, request_headers(ECHO)))
            send_message(client, 23, b"still")
            return refused, client.wait_for_frame(DataFrame, 23)

        refused, echoed = await while_probing(stack, open_eleven)
    assert refused is not None
    assert refused.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
    assert echoed is not None and echoed.data == message(b"still")


async def test_the_server_advertises_its_stream_and_header_list_limits():
    async with serving(TransportLimits(max_concurrent_streams=77)) as stack:

        def settings() -> dict:
            client = RawH2(stack.port)
            changed = client.wait_for(h2.events.RemoteSettingsChanged)
            return {code: value.new_value for code, value in changed.changed_settings.items()}

        advertised = await asyncio.to_thread(settings)
    codes = h2.settings.SettingCodes
    assert advertised[codes.MAX_CONCURRENT_STREAMS] == 77
    assert advertised[codes.MAX_HEADER_LIST_SIZE] == 16 * 1024
    assert advertised[codes.INITIAL_WINDOW_SIZE] == MIB


async def test_a_header_block_over_the_limit_in_continuation_frames_closes_the_connection():
    async with serving() as stack:
        goaway = await goaway_for(
            stack, lambda client: continuation_frames(client, 1, count=63, size=16_000)
        )
    assert goaway is not None and goaway.error_code == CALM
    assert stack.grpc.trips["header_block"] == 1


async def test_a_header_list_over_the_limit_closes_the_connection():
    async with serving() as stack:

        def oversized() -> bool:
            client = RawH2(stack.port)
            headers = request_headers(SINK, [("x-big", "v" * 9_000), ("x-big2", "w" * 9_000)])
            client.h2.send_headers(1, headers)
            client.flush()
            goaway = client.goaway()
            return goaway is not None and goaway.error_code == CALM

        assert await while_probing(stack, oversized)


async def test_a_block_with_three_table_size_updates_closes_the_connection():
    async with serving() as stack:

        def updates() -> GoAwayFrame | None:
            client = RawH2(stack.port)
            block = b"\x20\x20\x20" + client.h2.encoder.encode(request_headers(SINK))
            frame = HeadersFrame(1, data=block)
            frame.flags.add("END_HEADERS")
            client.send_raw(frame.serialize())
            return client.goaway()

        goaway = await asyncio.to_thread(updates)
    assert goaway is not None and goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR


@pytest.mark.parametrize(
    "headers",
    [
        request_headers(SINK, [("connection", "close")]),
        request_headers(SINK, [("transfer-encoding", "chunked")]),
        [("content-type", "application/grpc"), ("x-no", "pseudo-headers")],
        request_headers(SINK, [("host", "elsewhere")]),
    ],
    ids=["connection", "transfer-encoding", "no-pseudo-headers", "host-differs-from-authority"],
)
async def test_malformed_request_headers_reset_the_stream_and_the_connection_goes_on(headers):
    async with serving() as stack:

        def malformed() -> tuple[object, object, RawH2]:
            client = RawH2(stack.port)
            client.send_raw(client.headers_frame(1, headers))
            reset = client.wait_for_frame(RstStreamFrame, 1)
            client.send_raw(client.headers_frame(3, request_headers(ECHO)))
            send_message(client, 3, b"next")
            return reset, client.wait_for_frame(DataFrame, 3), client

        reset, echoed, _client = await asyncio.to_thread(malformed)
        assert list(stack.connection().calls) == [3]
    assert reset is not None and reset.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert echoed is not None and echoed.data == message(b"next")


async def test_an_unknown_method_is_answered_without_its_path():
    async with serving() as stack:

        def unknown() -> list:
            client = RawH2(stack.port)
            client.open(1, "/x/" + "p" * 8_000, b"")
            response = client.wait_for(h2.events.ResponseReceived, stream_id=1)
            return response.headers

        headers = dict(await asyncio.to_thread(unknown))
    assert headers[b"grpc-status"] == b"12"
    assert headers[b"grpc-message"] == b"unknown method"


# -- backpressure ------------------------------------------------------------------


async def test_a_client_that_never_reads_cannot_grow_the_servers_write_buffer():
    limits = TransportLimits(
        stream_window_bytes=16 * MIB,
        connection_window_bytes=16 * MIB,
        max_call_outbox_bytes=64 * MIB,
        connection_buffer_bytes=64 * MIB,
    )
    open_window = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1}
    async with serving(limits) as stack:

        def never_read() -> RawH2:
            client = RawH2(stack.port, open_window, receive_buffer=4096)
            client.h2.increment_flow_control_window(2**31 - 1 - 65_535)
            client.flush()
            client.send_raw(client.headers_frame(1, request_headers(ECHO)))
            client.sock.settimeout(0.5)  # the server stops reading too, at some point
            for _ in range(15):
                send_message(client, 1, b"e" * (MIB - 64))
                if client.closed:
                    break
            return client  # kept open, never read

        client = await while_probing(stack, never_read)
        connection = stack.connection()
        assert connection._outbound.paused
        written = connection._transport.get_write_buffer_size()
        client.sock.setblocking(False)
        with contextlib.suppress(OSError):
            client.sock.send(PingFrame(0, opaque_data=b"12345678").serialize() * 10_000)
        # Not reading while its replies wait, the server cannot answer the pings.
        assert not connection._transport.is_reading()
        assert connection._transport.get_write_buffer_size() == written
        assert written < 256 * 1024
        client.close()


async def test_a_client_with_a_zero_window_holds_the_server_within_its_budget():
    limits = TransportLimits(
        connection_buffer_bytes=2 * MIB,
        connection_window_bytes=2 * MIB,
        stream_window_bytes=MIB,
        max_call_outbox_bytes=64 * MIB,
    )
    async with serving(limits) as stack:

        def zero_window() -> tuple[int, RawH2]:
            client = RawH2(stack.port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
            client.wait_for(h2.events.RemoteSettingsChanged)
            client.h2.send_headers(1, request_headers(ECHO))
            body = message(b"x" * (MIB - 5))
            sent, stalled_since = 0, time.monotonic()
            while sent < 100 * MIB and time.monotonic() - stalled_since < 0.5:
                window = client.h2.local_flow_control_window(1)
                if window > 0:
                    start = sent % len(body)
                    chunk = body[start : start + min(window, 16_384, len(body) - start)]
                    client.h2.send_data(1, chunk)
                    client.flush()
                    sent += len(chunk)
                    stalled_since = time.monotonic()
                else:
                    client.read(0.05)
            return sent, client

        sent, _client = await while_probing(stack, zero_window)
        held = stack.connection().buffered
    assert sent < 8 * MIB
    assert held <= limits.connection_buffer_bytes + limits.connection_window_bytes + MIB


async def test_a_call_whose_replies_pile_up_past_its_outbox_cap_is_reset():
    limits = TransportLimits(
        max_call_outbox_bytes=2 * MIB, stream_window_bytes=4 * MIB, connection_window_bytes=8 * MIB
    )
    async with serving(limits) as stack:

        def pile_up() -> object:
            client = RawH2(stack.port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
            client.send_raw(client.headers_frame(1, request_headers(ECHO)))
            for _ in range(3):
                send_message(client, 1, b"y" * (MIB - 64))
            return client.wait_for_frame(RstStreamFrame, 1)

        reset = await while_probing(stack, pile_up)
    assert reset is not None and reset.error_code == CALM
    assert stack.log == ["cancel"]
    assert stack.grpc.trips["call_outbox"] == 1


async def test_data_is_acknowledged_only_while_the_connection_is_within_its_budget():
    limits = TransportLimits(
        connection_buffer_bytes=MIB, stream_window_bytes=4 * MIB, max_call_outbox_bytes=64 * MIB
    )
    async with serving(limits) as stack:
        client = await asyncio.to_thread(
            RawH2, stack.port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        )
        client.send_raw(client.headers_frame(1, request_headers(ECHO)))
        send_message(client, 1, b"z" * 600_000)
        send_message(client, 1, b"z" * 600_000)
        await eventually(lambda: stack.grpc.connections and stack.connection().buffered > MIB)
        assert stack.connection()._held_acks
        client.close()


# -- time and connections -------------------------------------------------------------


async def test_a_connection_that_never_sends_its_preface_is_closed_at_the_handshake_deadline():
    async with serving(TransportLimits(handshake_timeout=0.2)) as stack:
        client = await asyncio.to_thread(RawH2, stack.port, preface=False)
        assert await asyncio.to_thread(client.wait_closed, 3)
    assert stack.grpc.trips["handshake_timeout"] == 1


async def test_a_tls_connection_that_never_sends_its_client_hello_is_closed_at_the_deadline():
    server = GrpcServer({}, limits=TransportLimits(handshake_timeout=0.3))
    port = await server.start("127.0.0.1", 0, server_ssl_context())
    try:

        def silent_client() -> tuple[bytes, float]:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                start = time.monotonic()
                return sock.recv(1), time.monotonic() - start

        received, waited = await asyncio.to_thread(silent_client)
    finally:
        await server.stop(None)
    assert received == b""  # closed by the server, nothing sent
    assert 0.25 <= waited < 3


async def test_a_host_field_equal_to_authority_is_served():
    async with serving() as stack:

        def with_host() -> object:
            client = RawH2(stack.port)
            client.send_raw(client.headers_frame(1, request_headers(ECHO, [("host", "test")])))
            send_message(client, 1, b"hello")
            return client.wait_for_frame(DataFrame, 1)

        echoed = await asyncio.to_thread(with_host)
    assert echoed is not None and echoed.data == message(b"hello")


async def test_an_idle_connection_gets_goaway_and_is_closed():
    async with serving(TransportLimits(idle_timeout=0.2)) as stack:
        client = await asyncio.to_thread(RawH2, stack.port)
        assert await asyncio.to_thread(client.wait_closed, 3)
    assert any(isinstance(frame, GoAwayFrame) for frame in client.frames)
    assert stack.grpc.trips["idle_timeout"] == 1


async def test_a_connection_that_does_not_answer_keepalive_pings_is_closed():
    limits = TransportLimits(keepalive_time=0.2, keepalive_timeout=0.2)
    async with serving(limits) as stack:
        client = await asyncio.to_thread(RawH2, stack.port)
        client.h2.send_headers(1, request_headers(SINK))
        await asyncio.to_thread(client.flush)
        # The client reads nothing, so answers nothing.
        await eventually(lambda: stack.grpc.trips["keepalive_timeout"] == 1)
        await eventually(lambda: not stack.grpc.connections)


async def test_a_connection_that_answers_keepalive_pings_stays():
    limits = TransportLimits(keepalive_time=0.2, keepalive_timeout=0.2)
    async with serving(limits) as stack:
        client = await asyncio.to_thread(RawH2, stack.port)
        client.open(1, SINK)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            await asyncio.to_thread(client.read, 0.05)  # h2 answers PINGs as it reads
        assert not client.closed
        assert stack.grpc.trips["keepalive_timeout"] == 0


async def test_connections_over_the_cap_are_closed_and_health_still_answers():
    async with serving(TransportLimits(max_connections=4)) as stack:

        def crowd() -> list[RawH2]:
            clients = [RawH2(stack.port) for _ in range(6)]
            for client in clients[4:]:
                client.wait_closed()
            return clients

        clients = await while_probing(stack, crowd)
        answered = [await asyncio.to_thread(client.round_trip) for client in clients]
    assert answered == [True] * 4 + [False] * 2
    assert stack.grpc.trips["max_connections"] == 2


# -- work per frame and fairness ----------------------------------------------------------


async def test_a_window_update_pumps_only_the_calls_blocked_on_flow_control(monkeypatch):
    pumped: list[int] = []
    pump = Outbound.pump

    def counted(self, call):
        pumped.append(call.id)
        return pump(self, call)

    async with serving() as stack:
        client = await asyncio.to_thread(RawH2, stack.port)
        client.send_raw(new_streams(client, 1, 2_000))
        await eventually(lambda: sum(len(c.calls) for c in stack.grpc.connections) == 2_000)
        monkeypatch.setattr(Outbound, "pump", counted)
        client.send_raw(WindowUpdateFrame(0, window_increment=1).serialize() * 100)
        client.send_raw(SettingsFrame(0, settings={4: 70_000}).serialize())
        assert await asyncio.to_thread(client.round_trip)  # all of it handled
        assert len(stack.connection().calls) == 2_000
    assert pumped == []


def pumps_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream ids of the calls pumped from now on."""
    pumped: list[int] = []
    pump = Outbound.pump

    def counted(self, call):
        pumped.append(call.id)
        return pump(self, call)

    monkeypatch.setattr(Outbound, "pump", counted)
    return pumped


def echo_calls(client: RawH2, count: int, size: int) -> None:
    out = bytearray(new_streams(client, 1, count, ECHO))
    for stream_id in range(1, 2 * count, 2):
        out += DataFrame(stream_id, data=message(b"e" * size)).serialize()
    client.send_raw(bytes(out))


def reply_bytes(client: RawH2, count: int, timeout: float = 5.0) -> set[int]:
    """The sizes of the replies of `count` calls, once each has `size` bytes
    or `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        received: dict[int, int] = dict.fromkeys(range(1, 2 * count, 2), 0)
        for frame in client.frames:
            if isinstance(frame, DataFrame):
                received[frame.stream_id] += len(frame.data)
        if min(received.values()) >= 205 or time.monotonic() > deadline or client.closed:
            return set(received.values())
        client.read(0.05)


async def test_a_connection_window_update_pumps_the_calls_it_can_serve_and_no_more(monkeypatch):
    async with serving() as stack:
        client = await asyncio.to_thread(RawH2, stack.port)
        echo_calls(client, 1_000, 200)  # 205 KB of replies: ~680 wait on the connection window
        assert await asyncio.to_thread(client.round_trip)
        pumped = pumps_counted(monkeypatch)
        client.send_raw(WindowUpdateFrame(0, window_increment=1).serialize() * 10)
        assert await asyncio.to_thread(client.round_trip)
        assert 1 <= len(pumped) <= 10
        client.send_raw(WindowUpdateFrame(0, window_increment=MIB).serialize())
        assert await asyncio.to_thread(reply_bytes, client, 1_000) == {205}


async def test_only_a_settings_frame_that_raises_the_initial_window_pumps_blocked_calls(
    monkeypatch,
):
    initial_window = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
    async with serving() as stack:
        client = await asyncio.to_thread(RawH2, stack.port, {initial_window: 0})
        echo_calls(client, 200, 200)  # every reply waits on its stream's window
        assert await asyncio.to_thread(client.round_trip)
        pumped = pumps_counted(monkeypatch)
        client.send_raw(SettingsFrame(0, settings={initial_window: 0, 1: 4096}).serialize())
        assert await asyncio.to_thread(client.round_trip)
        assert pumped == []
        client.send_raw(SettingsFrame(0, settings={initial_window: 205}).serialize())
        assert await asyncio.to_thread(reply_bytes, client, 200) == {205}
    assert sorted(pumped) == list(range(1, 400, 2))


async def test_a_burst_of_new_streams_yields_the_loop_between_turns():
    """Another task on the loop runs between the connection's turns: it sees
    the streams opened so far grow about max_new_streams_per_turn at a time.
    Counted in the loop's turns, so it holds on a loaded machine too."""
    async with serving() as stack:
        client = await asyncio.to_thread(RawH2, stack.port)
        burst = await asyncio.to_thread(new_streams, client, 1, 3_000)
        await eventually(lambda: len(stack.grpc.connections) == 1)
        calls = stack.connection().calls
        seen: set[int] = set()

        async def watch() -> None:  # one step a turn of the loop
            while len(calls) < 3_000:
                seen.add(len(calls))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await asyncio.to_thread(client.send_raw, burst)
        await asyncio.wait_for(watcher, 20)
        client.close()
    turns = 3_000 // TransportLimits().max_new_streams_per_turn
    # at most a few reads' worth of counts without the yield; one a turn with it
    assert len(seen - {0}) >= turns // 2, sorted(seen)
    assert stack.grpc.trips["turn_yield"] >= 3_000 // 100


def test_limits_refuse_a_zero_or_negative_value():
    with pytest.raises(ValueError, match="max_concurrent_streams"):
        TransportLimits(max_concurrent_streams=0)
    with pytest.raises(ValueError, match="windows"):
        replace(TransportLimits(), stream_window_bytes=2**31)
