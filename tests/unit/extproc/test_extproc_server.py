"""The grpc.aio adapter, driven over a loopback gRPC channel (no Envoy)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from extproc_wire import request_body, request_headers, response_body, response_headers

from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.extproc.server import ExtProcServicer, add_to_server
from epp.flowcontrol.outcome import Outcome

BODY = json.dumps({"model": "m", "prompt": "p"}).encode()
HEADERS = {":path": "/v1/completions"}


class Admission:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.completed = []

    async def admit(self, request):
        if self.error:
            raise self.error
        request.endpoint = "10.0.0.1:80"
        return Outcome.DISPATCHED

    def complete(self, request, input_tokens=None, output_tokens=0):
        self.completed.append((input_tokens, output_tokens))


@pytest.fixture
async def serve():
    servers = []

    async def start(admission, listener=None):
        server = grpc.aio.server()
        servicer = ExtProcServicer(admission, lambda headers: 0, listener=listener)
        add_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        servers.append((server, channel))
        return pb_grpc.ExternalProcessorStub(channel), servicer

    yield start
    for server, channel in servers:
        await channel.close()
        await server.stop(grace=None)


async def test_dispatched_request_gets_replies_and_release_reports_usage(serve):
    admission = Admission()
    released = []
    stub, servicer = await serve(admission, released.append)
    usage = b'{"usage":{"prompt_tokens":2,"completion_tokens":5}}'
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    kinds = [(await call.read()).WhichOneof("response") for _ in range(2)]
    await call.write(response_headers({"content-type": "application/json"}))
    await call.write(response_body(usage, end_of_stream=True))
    kinds += [(await call.read()).WhichOneof("response") for _ in range(2)]
    await call.done_writing()
    assert kinds == ["request_headers", "request_body", "response_headers", "response_body"]
    assert await call.read() == grpc.aio.EOF
    assert admission.completed == [(2, 5)]
    assert [(e.input_tokens, e.output_tokens) for e in released] == [(2, 5)]
    assert servicer.open_streams == 0


async def test_admission_error_is_answered_500(serve):
    stub, _ = await serve(Admission(error=RuntimeError("boom")))
    call = stub.Process()
    await call.write(request_headers(HEADERS))
    await call.write(request_body(BODY))
    reply = await call.read()
    assert reply.immediate_response.status.code == 500
    await call.done_writing()


class ClosingContext:
    """A servicer context cancelled inside its n-th write, as when Envoy ends the stream."""

    def __init__(self, cancel_at: int) -> None:
        self.writes = 0
        self.cancel_at = cancel_at

    async def write(self, message):
        self.writes += 1
        if self.writes == self.cancel_at:
            raise asyncio.CancelledError


async def whole_exchange():
    yield request_headers(HEADERS)
    yield request_body(BODY)
    yield response_headers({"content-type": "application/json"})
    yield response_body(b'{"usage":{"prompt_tokens":1,"completion_tokens":4}}', end_of_stream=True)


@pytest.mark.parametrize("cancel_at", [1, 2, 3, 4])
async def test_request_is_released_once_whichever_write_is_cancelled(cancel_at):
    admission = Admission()
    servicer = ExtProcServicer(admission, lambda headers: 0)
    with pytest.raises(asyncio.CancelledError):
        await servicer.Process(whole_exchange(), ClosingContext(cancel_at))
    expected = (1, 4) if cancel_at == 4 else (None, 0)
    assert admission.completed == [expected]
    assert servicer.open_streams == 0
