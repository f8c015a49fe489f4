"""An aiohttp server on a free loopback port for the tests' model servers
and metrics pages:

    async with http_server({"/metrics": handler}) as server:
        f"127.0.0.1:{server.port}"
"""

from __future__ import annotations

import contextlib
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
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    server = TestServer(app, host="127.0.0.1", port=None)
    await server.start_server(ssl=ssl_context)
    try:
        yield server
    finally:
        await server.close()
