"""gRPC health for kubelet probes and Envoy.

Services: "liveness" is SERVING for the whole life of the process (the event
loop answers); "readiness", "" (the server as a whole), the ext_proc service
and "inference-extension" (the service the reference's Helm chart probes
with one replica) turn SERVING once the EPP has its objectives and endpoints
(files loaded, or the cluster synced) and NOT_SERVING when it starts
shutting down. With leader election (`leader_gated`), they are SERVING only
on the holder of the pool's Lease, as in the reference, so that a Service in
front of several replicas sends traffic to the leader only.

The health port is a grpc.aio server with grpc-health-checking's servicer
(Check and Watch); the ext_proc port (epp.transport.grpc_h2) answers Check from the
same states (`check_route`).
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from epp.transport.grpc_h2 import Call, Status

LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
CHART_PROBE = "inference-extension"
"""The service name the reference chart's probes ask for with one replica
(the reference answers any name then)."""
READY_SERVICES = ("", READINESS, EXT_PROC, CHART_PROBE)
CHECK_METHOD = "/grpc.health.v1.Health/Check"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """The EPP's health states; see the module docstring."""

    def __init__(self, leader_gated: bool = False) -> None:
        self.servicer = health_aio.HealthServicer()
        self.statuses: dict[str, int] = {}
        self.ready = False
        self._closing = False
        self._synced = False
        self._leader_gated = leader_gated
        self._leading = not leader_gated

    async def start(self) -> None:
        await self._set(LIVENESS, SERVING)
        for service in READY_SERVICES:
            await self._set(service, NOT_SERVING)

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def check_route(self, call: Call) -> HealthCheck:
        return HealthCheck(self.statuses, call)

    async def set_ready(self) -> None:
        """The inputs are loaded (or synced)."""
        self._synced = True
        await self._publish()

    async def set_leading(self, leading: bool) -> None:
        """This replica gained or lost the pool's Lease (ignored unless leader_gated)."""
        self._leading = leading or not self._leader_gated
        await self._publish()

    async def _publish(self) -> None:
        if self._closing:
            return
        ready = self._synced and self._leading
        if ready == self.ready and self.statuses.get(READINESS) is not None:
            return
        self.ready = ready
        for service in READY_SERVICES:
            await self._set(service, SERVING if ready else NOT_SERVING)

    async def shutting_down(self) -> None:
        """Readiness goes NOT_SERVING for good; liveness stays SERVING."""
        self._closing = True
        self.ready = False
        for service in READY_SERVICES:
            await self._set(service, NOT_SERVING)

    async def _set(self, service: str, status: int) -> None:
        self.statuses[service] = status
        await self.servicer.set(service, status)


class HealthCheck:
    """`Health/Check` on epp.transport.grpc_h2: one request, one answer; NOT_FOUND for
    an unknown service, as grpc-health-checking answers."""

    __slots__ = ("_call", "_service", "_statuses")

    def __init__(self, statuses: dict[str, int], call: Call) -> None:
        self._statuses = statuses
        self._call = call
        self._service: str | None = None

    def on_message(self, payload: bytes) -> None:
        try:
            self._service = health_pb2.HealthCheckRequest.FromString(payload).service
        except DecodeError:
            self._call.finish(Status.INVALID_ARGUMENT, "not a HealthCheckRequest")

    def on_half_close(self) -> None:
        status = self._statuses.get(self._service or "")
        if self._service is None:
            self._call.finish(Status.INVALID_ARGUMENT, "no HealthCheckRequest")
        elif status is None:
            self._call.finish(Status.NOT_FOUND, "unknown service")
        else:
            answer = health_pb2.HealthCheckResponse(status=status)  # type: ignore[arg-type]
            self._call.send(answer.SerializeToString())
            self._call.finish()

    def on_cancel(self) -> None:
        pass
