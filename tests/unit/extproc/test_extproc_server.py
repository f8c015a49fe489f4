"""The ext_proc service on epp.transport, driven by a grpc.aio client (no Envoy)."""

from __future__ import annotations

import asyncio
import json
from typing import NamedTuple

import grpc
import pytest
from extproc_wire import request_body, request_headers, response_body, response_headers

from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.extproc.messages import ProcessingResponse
from epp.extproc.server import PROCESS_METHOD, ExtProcService
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import Usage
from epp.transport import GrpcServer
from tests.support.waiting import eventually

BODY = json.dumps({"model": "m", "prompt": "p"}).encode()
HEADERS = {":path": "/v1/completions"}
USAGE = b'{"usage":{"prompt_tokens":2,"completion_tokens":5}}'


class Admission:
    """Dispatches at once; or raises `error`; or, with `hold`, queues for ever."""

    def __init__(self, error: Exception | None = None, hold: bool = False) -> None:
        self.error = error
        self.hold = hold
        self.waiting = asyncio.Event()
        self.withdrawn = []
        self.completed = []

    def offer(self, request):
        if self.error:
            raise self.error
        if self.hold:
            return None
        request.endpoint = "10.0.0.1:80"
        return Outcome.DISPATCHED

    async def wait(self, request):
        self.waiting.set()
        await asyncio.Event().wait()

    def withdraw(self, request):
        self.withdrawn.append(request)

    def complete(self, request, usage=None, itl=None):
        self.completed.append(usage)

    def first_token(self, request):
        pass

    def prefill_done(self, request):
        pass


class Served(NamedTuple):
    stub: pb_grpc.ExternalProcessorStub
    service: ExtProcService
    channel: grpc.aio.Channel


@pytest.fixture
async def serve():
    started = []

    async def start(admission, listener=None, screen=None, tokenize=None):
        service = ExtProcService(
            admission, lambda headers: 0, listener=listener, screen=screen, tokenize=tokenize
        )
        server = GrpcServer({PROCESS_METHOD: service.open})
        port = await server.start("127.0.0.1", 0)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, channel))
        return Served(pb_grpc.ExternalProcessorStub(channel), service, channel)

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop(grace=None)


async def test_dispatched_request_gets_replies_and_release_reports_usage(serve):
    admission = Admission()
    released = []
    stub, service, _ = await serve(admission, released.append)
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    kinds = [(await call.read()).WhichOneof("response") for _ in range(2)]
    await call.write(response_headers({"content-type": "application/json"}))
    await call.write(response_body(USAGE, end_of_stream=True))
    kinds += [(await call.read()).WhichOneof("response") for _ in range(2)]
    await call.done_writing()
    assert kinds == ["request_headers", "request_body", "response_headers", "response_body"]
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert admission.completed == [Usage(2, 5)]
    assert [e.usage for e in released] == [Usage(2, 5)]
    assert service.open_streams == 0


async def test_admission_error_is_answered_500(serve):
    stub, _, _ = await serve(Admission(error=RuntimeError("boom")))
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    reply = await call.read()
    assert reply.immediate_response.status.code == 500
    await call.done_writing()


async def test_a_call_answered_with_an_immediate_response_ends_ok_without_envoy_closing_it(
    serve,
):
    served = await serve(Admission(error=RuntimeError("boom")))
    call = served.stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    assert (await call.read()).immediate_response.status.code == 500
    assert await asyncio.wait_for(call.code(), 5) == grpc.StatusCode.OK
    assert served.service.open_streams == 0


async def test_a_screened_request_is_answered_500_and_never_offered(serve):
    admission = Admission(error=AssertionError("offered"))
    stub, _, _ = await serve(admission, screen=lambda request: "no room")
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    reply = await call.read()
    assert reply.immediate_response.status.code == 500
    assert reply.immediate_response.body == b"request cannot be admitted: no room\n"
    await call.done_writing()


async def test_bytes_that_are_not_a_processing_request_end_the_call_invalid_argument(serve):
    served = await serve(Admission())
    call = served.channel.stream_stream(PROCESS_METHOD)()
    await call.write(b"\xff\xff\xff")
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert served.service.open_streams == 0


@pytest.mark.parametrize("replies_before_reset", [0, 1, 2, 3])
async def test_request_is_released_once_whenever_envoy_resets_the_stream(
    serve, replies_before_reset
):
    admission = Admission()
    stub, service, _ = await serve(admission)
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    for _ in range(min(replies_before_reset, 2)):
        await call.read()
    if replies_before_reset == 3:
        await call.write(response_headers({"content-type": "application/json"}))
        await call.read()
    call.cancel()
    await eventually(lambda: service.open_streams == 0)
    assert admission.completed == [None]


async def test_reset_while_queued_withdraws_the_request_and_releases_nothing(serve):
    admission = Admission(hold=True)
    stub, service, _ = await serve(admission)
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    await asyncio.wait_for(admission.waiting.wait(), 5)
    call.cancel()
    await eventually(lambda: service.open_streams == 0)
    assert len(admission.withdrawn) == 1
    assert admission.completed == []


async def test_half_close_while_waiting_for_admission_ends_after_the_answer(serve):
    admission = Admission()
    stub, service, _ = await serve(admission)
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    await call.done_writing()
    kinds = [(await call.read()).WhichOneof("response") for _ in range(2)]
    assert kinds == ["request_headers", "request_body"]
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    assert admission.completed == [None]
    assert service.open_streams == 0


class Tokenizer:
    """Gives every request the tokens [1, 2, 3] once `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, request) -> None:
        self.started.set()
        await self.release.wait()
        request.token_ids = [1, 2, 3]
        request.input_tokens = 3


class OfferRecorder(Admission):
    def __init__(self) -> None:
        super().__init__()
        self.offered = []

    def offer(self, request):
        self.offered.append((request.payload.token_ids, request.input_tokens))
        return super().offer(request)


async def tokenizing(serve):
    """A call whose request body is being tokenized (the tokenizer held)."""
    admission, tokenizer = OfferRecorder(), Tokenizer()
    stub, service, _ = await serve(admission, tokenize=tokenizer)
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    await asyncio.wait_for(tokenizer.started.wait(), 5)
    return admission, tokenizer, service, call


async def test_a_request_is_offered_with_its_tokens_once_tokenized(serve):
    admission, tokenizer, _, call = await tokenizing(serve)
    await call.done_writing()  # arrives while tokenizing: answered after
    assert admission.offered == []
    tokenizer.release.set()
    kinds = [(await call.read()).WhichOneof("response") for _ in range(2)]
    assert kinds == ["request_headers", "request_body"]
    assert admission.offered == [([1, 2, 3], 3)]
    assert await call.code() == grpc.StatusCode.OK


async def test_a_reset_while_tokenizing_offers_nothing_and_withdraws_nothing(serve):
    admission, tokenizer, service, call = await tokenizing(serve)
    call.cancel()
    await eventually(lambda: service.open_streams == 0)
    tokenizer.release.set()
    await asyncio.sleep(0.05)
    assert admission.offered == []
    assert admission.withdrawn == []


class RecordingCall:
    """A Call that records what is sent, in one log with the admission's completions."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send(self, payload: bytes) -> None:
        reply = ProcessingResponse.FromString(payload)
        self.log.append(f"send {reply.WhichOneof('response')}")

    def finish(self, status=None, message: str = "") -> None:
        self.log.append("finish")


async def test_release_is_settled_after_the_last_reply_is_sent_in_the_same_turn():
    log: list[str] = []
    admission = Admission()
    admission.complete = lambda request, *usage: log.append("complete")
    service = ExtProcService(admission, lambda headers: 0)
    call = service.open(RecordingCall(log))
    for message in (
        request_headers(HEADERS),
        request_body(BODY),
        response_headers({"content-type": "application/json"}),
        response_body(USAGE, end_of_stream=True),
    ):
        call.on_message(message.SerializeToString())
    assert log == [
        "send request_headers",
        "send request_body",
        "send response_headers",
        "send response_body",
    ]
    await asyncio.sleep(0)
    assert log[-1] == "complete"


class Ticks:
    """A timer that advances one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_the_response_messages_handling_time_is_told_once_when_the_call_ends():
    told: list[float] = []
    service = ExtProcService(
        Admission(), lambda headers: 0, on_response_processed=told.append, timer=Ticks()
    )
    call = service.open(RecordingCall([]))
    for message in (request_headers(HEADERS), request_body(BODY)):
        call.on_message(message.SerializeToString())
    call.on_message(response_headers({"content-type": "text/event-stream"}).SerializeToString())
    call.on_message(response_body(b"data: {}\n\n").SerializeToString())
    assert told == []
    call.on_message(response_body(b"data: [DONE]\n\n", end_of_stream=True).SerializeToString())
    call.on_half_close()
    assert told == [3.0]  # three response messages, one tick each


async def test_a_call_that_never_reached_the_response_tells_no_response_time():
    told: list[float] = []
    service = ExtProcService(
        Admission(), lambda headers: 0, on_response_processed=told.append, timer=Ticks()
    )
    call = service.open(RecordingCall([]))
    call.on_message(request_headers(HEADERS).SerializeToString())
    call.on_cancel()
    assert told == []
