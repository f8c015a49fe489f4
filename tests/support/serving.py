"""An in-process EppServer on loopback free ports, stopped at the end.

async with serving(endpoints="127.0.0.1:1") as server:
    server.ports["grpc"], server.ports["metrics"]
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from epp.serve.server import EppServer, ServeOptions


def loopback_options(**options: object) -> ServeOptions:
    """ServeOptions with free loopback ports and a short drain, plus `options`."""
    settings: dict[str, object] = {
        "grpc_port": 0,
        "grpc_health_port": 0,
        "metrics_port": 0,
        "bind_address": "127.0.0.1",
        "drain_timeout": 0.1,
        **options,
    }
    return ServeOptions(**settings)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def serving(**options: object) -> AsyncIterator[EppServer]:
    server = EppServer(loopback_options(**options))
    await server.start()
    try:
        yield server
    finally:
        await asyncio.wait_for(server.stop(), 10)
