"""The floor of any ext_proc server in Python here: no logic, the same transport.

    python -m bench.extproc_floor ENDPOINT PORT_FILE

Serves `ExternalProcessor/Process` on a free loopback port (written to
PORT_FILE) with epp.transport on uvloop, as `epp serve` does, but with no
parsing, flow control, scheduling or metrics: every request goes to ENDPOINT,
bodies are echoed back as they come. TLS with a self-signed certificate, as
`epp serve` by default (the gateway's Envoy speaks TLS to both). bench/extproc_e2e.py runs it beside
`epp serve` so the EPP's own share of the added latency is the difference.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from epp.extproc import messages
from epp.extproc.server import PROCESS_METHOD
from epp.serve.tls import server_ssl_context
from epp.transport import Call, GrpcServer


class FixedEndpoint:
    """One Process call: the replies Envoy needs, nothing else."""

    def __init__(self, call: Call, endpoint: str) -> None:
        self._call = call
        self._endpoint = endpoint
        self._body: list[bytes] = []

    def on_message(self, payload: bytes) -> None:
        message = messages.ProcessingRequest.FromString(payload)
        kind = message.WhichOneof("request")
        if kind == "request_body":
            self._body.append(message.request_body.body)
            if message.request_body.end_of_stream:
                self._forward(b"".join(self._body))
        elif kind == "response_headers":
            self._send(messages.response_headers_reply())
        elif kind == "response_body":
            body = message.response_body
            self._send(messages.response_body_reply(body.body, body.end_of_stream))
        elif kind in ("request_trailers", "response_trailers"):
            self._send(messages.trailers_reply(response=kind == "response_trailers"))

    def on_half_close(self) -> None:
        self._call.finish()

    def on_cancel(self) -> None:
        pass

    def _forward(self, body: bytes) -> None:
        headers = [("content-length", str(len(body)))]
        self._send(messages.routed_headers_reply(self._endpoint, headers, []))
        for reply in messages.body_chunks(body, True):
            self._send(reply)

    def _send(self, reply: messages.ProcessingResponse) -> None:
        self._call.send(reply.SerializeToString())


async def serve(endpoint: str, port_file: Path) -> None:
    server = GrpcServer({PROCESS_METHOD: lambda call: FixedEndpoint(call, endpoint)})
    announce_port(await server.start("127.0.0.1", 0, server_ssl_context()), port_file)
    await asyncio.Event().wait()


def announce_port(port: int, port_file: Path) -> None:
    """Tell the bench the bound port: written whole, so it never reads half a file."""
    temporary = port_file.with_name(port_file.name + ".tmp")
    temporary.write_text(str(port))
    temporary.replace(port_file)


def run(serve: Callable[[str, Path], Awaitable[None]]) -> None:
    """A floor's command line: ENDPOINT PORT_FILE."""
    endpoint, port_file = sys.argv[1:]
    uvloop.run(serve(endpoint, Path(port_file)))


def main() -> None:
    run(serve)


if __name__ == "__main__":
    main()
