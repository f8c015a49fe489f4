"""epp.transport, the gRPC server of the ext_proc port, against grpc.aio as the client."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
import uvloop
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame

from epp.transport import Call, GrpcServer, Status, TransportLimits
from epp.transport.h2_internals import STREAM_WALK_SLACK, ServerH2Connection
from tests.support.grpc_handlers import ECHO, Echo
from tests.support.waiting import eventually

FAIL = "/test.Echo/Fail"
REFUSE = "/test.Echo/Refuse"


class Failing(Echo):
    def on_message(self, payload: bytes) -> None:
        raise RuntimeError("handler bug")


class Refusing(Echo):
    def on_message(self, payload: bytes) -> None:
        self.call.finish(Status.NOT_FOUND, "no such thing: 100%")


@dataclass(slots=True)
class Served:
    """The server under test, a grpc.aio channel to it, and its handlers' log."""

    grpc: GrpcServer
    channel: grpc.aio.Channel
    port: int
    log: list[str]


@pytest.fixture
async def server():
    log: list[str] = []
    grpc_server = GrpcServer(
        {
            ECHO: lambda call: Echo(call, log),
            FAIL: lambda call: Failing(call, log),
            REFUSE: lambda call: Refusing(call, log),
        },
        limits=TransportLimits(max_receive_message_bytes=4 * 1024 * 1024),
    )
    port = await grpc_server.start("127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield Served(grpc_server, channel, port, log)
    await channel.close()
    await grpc_server.stop(grace=None)


async def test_messages_come_back_in_order_and_the_call_ends_ok(server):
    call = server.channel.stream_stream(ECHO)()
    for payload in (b"one", b"", b"three"):
        await call.write(payload)
    await call.done_writing()
    assert [await call.read() for _ in range(3)] == [b"one", b"", b"three"]
    assert await call.code() == grpc.StatusCode.OK
    assert server.log == ["half-close"]


async def test_unary_call_is_one_message_each_way(server):
    assert await server.channel.unary_unary(ECHO)(b"ping") == b"ping"


async def test_messages_larger_than_the_flow_control_windows_pass_whole(server):
    big = bytes(range(256)) * 12_000
    call = server.channel.stream_stream(ECHO)()
    await call.write(big)
    await call.write(big[::-1])
    await call.done_writing()
    assert await call.read() == big
    assert await call.read() == big[::-1]
    assert await call.code() == grpc.StatusCode.OK


async def test_unknown_method_is_unimplemented(server):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await server.channel.unary_unary("/test.Echo/Nope")(b"x")
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_message_over_the_limit_is_resource_exhausted_and_the_handler_told(server):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await server.channel.unary_unary(ECHO)(b"x" * (4 * 1024 * 1024 + 1))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await eventually(lambda: server.log == ["cancel"])


async def test_handler_exception_is_internal_and_the_server_goes_on(server):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await server.channel.unary_unary(FAIL)(b"x")
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert await server.channel.unary_unary(ECHO)(b"still here") == b"still here"


async def test_handler_status_and_message_reach_the_client(server):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await server.channel.unary_unary(REFUSE)(b"x")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error.value.details() == "no such thing: 100%"


async def test_client_cancel_tells_the_handler_once(server):
    call = server.channel.stream_stream(ECHO)()
    await call.write(b"hello")
    assert await call.read() == b"hello"
    call.cancel()
    await eventually(lambda: server.log == ["cancel"])
    # Closing every connection is the handler's last chance to be told again.
    await server.grpc.stop(grace=None)
    assert server.log == ["cancel"]


class RawClient:
    """An h2 client on a plain socket, for what grpc.aio will not do."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def open(self, stream_id: int, path: str, payload: bytes) -> None:
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "test"),
            ("content-type", "application/grpc"),
        ]
        self.h2.send_headers(stream_id, headers)
        self.h2.send_data(stream_id, b"\x00" + len(payload).to_bytes(4, "big") + payload)

    async def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def next_event(self, stream_id: int, kind: type[h2.events.Event]):
        while True:
            for event in self.h2.receive_data(await self.reader.read(65536)):
                if isinstance(event, kind) and event.stream_id == stream_id:
                    return event

    async def data_on(self, stream_id: int) -> bytes:
        return (await self.next_event(stream_id, h2.events.DataReceived)).data


async def test_messages_sent_in_one_turn_leave_in_one_data_frame(server):
    client = await RawClient.connect(server.port)
    client.open(1, ECHO, b"one")
    client.h2.send_data(1, b"\x00\x00\x00\x00\x03two")
    await client.flush()
    assert await client.data_on(1) == b"\x00\x00\x00\x00\x03one\x00\x00\x00\x00\x03two"


async def test_a_request_that_is_not_grpc_is_answered_415(server):
    client = await RawClient.connect(server.port)
    headers = [(":method", "POST"), (":scheme", "http"), (":path", ECHO), (":authority", "a")]
    client.h2.send_headers(1, [*headers, ("content-type", "text/plain")], end_stream=True)
    await client.flush()
    response = await client.next_event(1, h2.events.ResponseReceived)
    assert dict(response.headers)[b":status"] == b"415"


async def test_open_call_still_answers_after_the_client_sends_goaway(server):
    client = await RawClient.connect(server.port)
    client.open(1, ECHO, b"first")
    await client.flush()
    assert await client.data_on(1) == b"\x00\x00\x00\x00\x05first"
    client.writer.write(GoAwayFrame(stream_id=0, last_stream_id=1).serialize())
    client.h2.send_data(1, b"\x00\x00\x00\x00\x06second")
    await client.flush()
    assert await client.data_on(1) == b"\x00\x00\x00\x00\x06second"


async def test_dropped_connection_cancels_its_open_calls(server):
    client = await RawClient.connect(server.port)
    client.open(1, ECHO, b"hello")
    await client.flush()
    assert await client.data_on(1) == b"\x00\x00\x00\x00\x05hello"
    client.writer.transport.abort()
    await eventually(lambda: not server.grpc.connections)
    assert server.log == ["cancel"]


async def test_reply_to_a_message_whose_stream_was_reset_in_the_same_read_is_dropped(
    server, caplog
):
    client = await RawClient.connect(server.port)
    client.open(1, ECHO, b"gone")
    client.h2.reset_stream(1)
    await client.flush()
    await eventually(lambda: server.log == ["cancel"])
    client.open(3, ECHO, b"next")
    await client.flush()
    assert await client.data_on(3) == b"\x00\x00\x00\x00\x04next"
    assert [record.message for record in caplog.records if record.levelno >= logging.ERROR] == []


async def test_stop_lets_an_open_call_finish_within_the_grace_period(server):
    call = server.channel.stream_stream(ECHO)()
    await call.write(b"hello")
    assert await call.read() == b"hello"
    stopping = asyncio.create_task(server.grpc.stop(grace=5))
    await eventually(lambda: not server.grpc.listening)
    await call.write(b"still open")
    assert await call.read() == b"still open"
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    await asyncio.wait_for(stopping, 5)
    assert server.log == ["half-close"]


async def test_stop_cancels_calls_still_open_after_the_grace_period(server):
    call = server.channel.stream_stream(ECHO)()
    await call.write(b"hello")
    assert await call.read() == b"hello"
    await server.grpc.stop(grace=0.1)
    assert server.log == ["cancel"]
    assert await call.code() != grpc.StatusCode.OK


def test_the_same_calls_work_on_uvloop():
    """`epp serve` runs on uvloop, whose transports are not asyncio's classes."""

    async def scenario() -> list[str]:
        log: list[str] = []
        grpc_server = GrpcServer({ECHO: lambda call: Echo(call, log)})
        port = await grpc_server.start("127.0.0.1", 0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            big = bytes(range(256)) * 12_000
            assert await channel.unary_unary(ECHO)(big) == big
            call = channel.stream_stream(ECHO)()
            await call.write(b"hello")
            assert await call.read() == b"hello"
            call.cancel()
            await eventually(lambda: log == ["half-close", "cancel"])
        await grpc_server.stop(grace=None)
        return log

    assert uvloop.run(scenario()) == ["half-close", "cancel"]


def h2_pair() -> tuple[h2.connection.H2Connection, ServerH2Connection]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = ServerH2Connection(h2.config.H2Configuration(client_side=False))
    server.local_settings = h2.settings.Settings(client=False)
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return client, server


def open_stream(client: h2.connection.H2Connection, stream_id: int) -> None:
    headers = [(":method", "POST"), (":scheme", "http"), (":path", ECHO), (":authority", "a")]
    client.send_headers(stream_id, headers)


def test_stream_table_drops_closed_streams_as_streams_come_and_go():
    client, server = h2_pair()
    for stream_id in range(1, 2 * 5_000, 2):
        open_stream(client, stream_id)
        client.reset_stream(stream_id)
        server.receive_data(client.data_to_send())
    assert len(server.streams) < 2 * STREAM_WALK_SLACK


def test_open_stream_count_is_exact_when_the_table_is_walked():
    client, server = h2_pair()
    for stream_id in range(1, 2 * 1_000, 2):
        open_stream(client, stream_id)
        if stream_id % 4 == 1:
            client.reset_stream(stream_id)
        server.receive_data(client.data_to_send())
    server._streams_after_walk = 0
    assert server.open_inbound_streams == 500
    assert len(server.streams) == 500


def test_opening_streams_walks_the_stream_table_a_logarithmic_number_of_times():
    client, server = h2_pair()
    walks = 0
    walk = server._open_streams

    def counted(remainder: int) -> int:
        nonlocal walks
        walks += 1
        return walk(remainder)

    server._open_streams = counted
    for stream_id in range(1, 2 * 2_000, 2):
        open_stream(client, stream_id)
        server.receive_data(client.data_to_send())
    assert len(server.streams) == 2_000
    assert walks <= 8


async def test_a_finished_call_and_its_handler_do_not_keep_each_other(server):
    """No reference cycle per call is left for the garbage collector."""
    handlers: list[Echo] = []

    def kept(call: Call) -> Echo:
        handlers.append(Echo(call, []))
        return handlers[-1]

    server.grpc.routes["/test.Echo/Kept"] = kept
    assert await server.channel.unary_unary("/test.Echo/Kept")(b"x") == b"x"
    call = server.channel.stream_stream("/test.Echo/Kept")()
    await call.write(b"y")
    assert await call.read() == b"y"
    call.cancel()
    await eventually(lambda: not any(c.calls for c in server.grpc.connections))
    assert [handler.call.handler for handler in handlers] == [None, None]


def late_data_after_reset(client: h2.connection.H2Connection) -> bytes:
    open_stream(client, 1)
    client.reset_stream(1)
    return client.data_to_send() + DataFrame(1, data=b"late").serialize()


def late_data_after_end(client: h2.connection.H2Connection) -> bytes:
    open_stream(client, 1)
    client.end_stream(1)
    return client.data_to_send() + DataFrame(1, data=b"late").serialize()


def new_stream_below_the_highest(client: h2.connection.H2Connection) -> bytes:
    open_stream(client, 5)
    sent = client.data_to_send()
    frame = HeadersFrame(3, data=client.encoder.encode([(":method", "POST")]))
    frame.flags.add("END_HEADERS")
    return sent + frame.serialize()


def reset_stream_reopened(client: h2.connection.H2Connection) -> bytes:
    open_stream(client, 1)
    open_stream(client, 3)
    client.reset_stream(1)
    frame = HeadersFrame(1, data=client.encoder.encode([(":method", "POST")]))
    frame.flags.add("END_HEADERS")
    return client.data_to_send() + frame.serialize()


@pytest.mark.parametrize(
    "scenario",
    [
        late_data_after_reset,
        late_data_after_end,
        new_stream_below_the_highest,
        reset_stream_reopened,
    ],
)
def test_frames_on_closed_streams_are_handled_as_h2_handles_them(scenario):
    """ServerH2Connection's own `_receive_frame` keeps h2's error handling."""

    def outcome(server_class: type[h2.connection.H2Connection]) -> tuple:
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        server = server_class(h2.config.H2Configuration(client_side=False))
        client.initiate_connection()
        server.initiate_connection()
        server.receive_data(client.data_to_send())
        server.data_to_send()
        try:
            events = server.receive_data(scenario(client))
        except h2.exceptions.ProtocolError as error:
            return type(error), server.data_to_send()
        return [repr(event) for event in events], server.data_to_send()

    assert outcome(ServerH2Connection) == outcome(h2.connection.H2Connection)
