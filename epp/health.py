"""gRPC health (grpc-health-checking) for kubelet probes and Envoy.

Services: "liveness" is SERVING for the whole life of the process (the event
loop answers); "readiness", "" (the server as a whole) and the ext_proc
service turn SERVING once the EPP has its objectives and endpoints (files
loaded, or the cluster synced) and NOT_SERVING when it starts shutting down.
One servicer is registered on the ext_proc port and on the health port.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("", READINESS, EXT_PROC)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """The EPP's health states; see the module docstring."""

    def __init__(self) -> None:
        self.servicer = health_aio.HealthServicer()
        self.ready = False
        self._closing = False

    async def start(self) -> None:
        await self.servicer.set(LIVENESS, SERVING)
        for service in READY_SERVICES:
            await self.servicer.set(service, NOT_SERVING)

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def set_ready(self) -> None:
        if self._closing:
            return
        self.ready = True
        for service in READY_SERVICES:
            await self.servicer.set(service, SERVING)

    async def shutting_down(self) -> None:
        """Readiness goes NOT_SERVING for good; liveness stays SERVING."""
        self._closing = True
        self.ready = False
        for service in READY_SERVICES:
            await self.servicer.set(service, NOT_SERVING)
