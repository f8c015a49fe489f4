"""Asking an EPP's gRPC health service, as a kubelet probe or Envoy would."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


async def health_status(channel: grpc.aio.Channel, service: str = "readiness") -> int:
    """The status `Health/Check` answers for `service` on `channel`."""
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    return reply.status


async def health_status_at(port: int, service: str = "readiness") -> int:
    """The same, over a fresh plaintext channel to 127.0.0.1:`port`."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await health_status(channel, service)
