"""bench.extproc_floor's no-logic ext_proc server, served by grpclib instead.

    python -m bench.grpclib_floor ENDPOINT PORT_FILE

For the transport's evaluation of grpclib (epp/transport/README.md): run
`python -m bench.extproc_e2e --floor bench.grpclib_floor` and compare the
floor's numbers with the EPP's, or with a run on the default floor. The
replies are the default floor's, message for message, over TLS as the
default floor's; grpclib runs each call as a task that reads its messages
one by one (`async for`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from bench.extproc_floor import announce_port, run
from epp.extproc import messages
from epp.extproc.server import PROCESS_METHOD
from epp.serve.tls import server_ssl_context


class FixedEndpointService:
    """One Process call per request: the replies Envoy needs, nothing else."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    async def process(self, stream: Stream) -> None:
        body: list[bytes] = []
        async for message in stream:
            kind = message.WhichOneof("request")
            if kind == "request_body":
                body.append(message.request_body.body)
                if message.request_body.end_of_stream:
                    joined = b"".join(body)
                    headers = [("content-length", str(len(joined)))]
                    await stream.send_message(
                        messages.routed_headers_reply(self._endpoint, headers, [])
                    )
                    for reply in messages.body_chunks(joined, True):
                        await stream.send_message(reply)
            elif kind == "response_headers":
                await stream.send_message(messages.response_headers_reply())
            elif kind == "response_body":
                chunk = message.response_body
                await stream.send_message(
                    messages.response_body_reply(chunk.body, chunk.end_of_stream)
                )
            elif kind in ("request_trailers", "response_trailers"):
                await stream.send_message(
                    messages.trailers_reply(response=kind == "response_trailers")
                )

    def __mapping__(self) -> dict[str, Handler]:
        return {
            PROCESS_METHOD: Handler(
                self.process,
                Cardinality.STREAM_STREAM,
                messages.ProcessingRequest,
                messages.ProcessingResponse,
            )
        }


async def serve(endpoint: str, port_file: Path) -> None:
    server = Server([FixedEndpointService(endpoint)])
    await server.start("127.0.0.1", 0, ssl=server_ssl_context())
    assert server._server is not None
    announce_port(server._server.sockets[0].getsockname()[1], port_file)
    await asyncio.Event().wait()


def main() -> None:
    run(serve)


if __name__ == "__main__":
    main()
