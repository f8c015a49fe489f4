"""A plain HTTP upstream for tests: an aiohttp server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def http_upstream(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], path: str = "/{tail:.*}"
) -> AsyncIterator[int]:
    """An HTTP server on a free port of 127.0.0.1 answering POSTs to `path`
    with `handle`; yields its port and is stopped on exit."""
    app = web.Application()
    app.router.add_post(path, handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
