"""An aiohttp server on a free loopback port for the tests' model servers
and metrics pages:

    async with http_server({"/metrics": handler}) as server:
        f"127.0.0.1:{server.port}"
    async with http_sites({"/metrics": handler}, 12) as ports:
        ...  # one app on 12 ports; `request_port(request)` tells them apart
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.test_utils import TestServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def http_server(
    routes: Mapping[str, Handler], ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[TestServer]:
    """GET `path` answered by its handler, for each of `routes`; stopped on exit."""
    server = TestServer(_app(routes), host="127.0.0.1", port=None)
    await server.start_server(ssl=ssl_context)
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def http_sites(routes: Mapping[str, Handler], count: int) -> AsyncIterator[list[int]]:
    """One app answering `routes` (as `http_server`) on `count` free loopback
    ports, which it yields; stopped on exit."""
    runner = web.AppRunner(_app(routes), access_log=None)
    await runner.setup()
    ports: list[int] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
            await web.SockSite(runner, sock).start()
        yield ports
    finally:
        await runner.cleanup()


def request_port(request: web.Request) -> int:
    """The local port `request` came in on (which of `http_sites`' ports)."""
    assert request.transport is not None
    return request.transport.get_extra_info("sockname")[1]


def _app(routes: Mapping[str, Handler]) -> web.Application:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    return app
