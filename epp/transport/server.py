"""The gRPC server: listens, caps its connections, runs their timers, and
shuts down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import Counter
from collections.abc import Mapping

from epp.transport.calls import Route
from epp.transport.connection import GrpcConnection
from epp.transport.limits import TransportLimits, effective_max_connections

TIMER_PERIOD = 1.0
"""How often every connection's deadlines are checked (seconds), or a
quarter of the shortest of them if that is shorter."""


class GrpcServer:
    """Serves `routes` (keyed by `/package.Service/Method`) within `limits`."""

    def __init__(
        self, routes: Mapping[str, Route], *, limits: TransportLimits | None = None
    ) -> None:
        self.routes = dict(routes)
        self.limits = limits or TransportLimits()
        self.max_connections = effective_max_connections(self.limits.max_connections)
        self.connections: set[GrpcConnection] = set()
        self.trips: Counter[str] = Counter()
        """How often each limit was hit, by name (exported as a metric)."""
        self._server: asyncio.Server | None = None
        self._timers: asyncio.Task[None] | None = None

    def trip(self, limit: str) -> None:
        self.trips[limit] += 1

    @property
    def open_connections(self) -> int:
        return len(self.connections)

    @property
    def listening(self) -> bool:
        """Whether new connections are accepted (no longer once `stop` begins)."""
        return self._server is not None and self._server.is_serving()

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on `host:port` (0: a free port); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GrpcConnection(self),
            host,
            port,
            ssl=ssl_context,
            ssl_handshake_timeout=self.limits.handshake_timeout if ssl_context else None,
        )
        self._start_timers()
        return self._server.sockets[0].getsockname()[1]

    async def adopt(self, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
        """Serve a connection accepted elsewhere (a protocol worker is handed
        the connections its core owner accepts), under the same limits."""
        self._start_timers()
        await asyncio.get_running_loop().connect_accepted_socket(
            lambda: GrpcConnection(self),
            sock,
            ssl=ssl_context,
            ssl_handshake_timeout=self.limits.handshake_timeout if ssl_context else None,
        )

    def _start_timers(self) -> None:
        if self._timers is None:
            self._timers = asyncio.create_task(self._run_timers(), name="grpc connection timers")

    async def _run_timers(self) -> None:
        limits = self.limits
        shortest = min(
            limits.handshake_timeout,
            limits.idle_timeout,
            limits.keepalive_time,
            limits.keepalive_timeout,
        )
        period = min(TIMER_PERIOD, shortest / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for connection in list(self.connections):
                connection.check_time(now)

    async def stop(self, grace: float | None) -> None:
        """Stop listening, send GOAWAY, give open calls up to `grace` seconds
        (None: none) to finish, then close every connection."""
        if self._server is not None:
            self._server.close()
        connections = list(self.connections)
        for connection in connections:
            connection.go_away()
        if grace and connections:
            waits = [asyncio.ensure_future(c.idle.wait()) for c in connections]
            _, pending = await asyncio.wait(waits, timeout=grace)
            for wait in pending:
                wait.cancel()
        if self._timers is not None:
            self._timers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timers
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
