"""Asking an EPP's gRPC health service, as a kubelet probe or Envoy would."""

from __future__ import annotations

import asyncio
import ssl

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


async def health_status(channel: grpc.aio.Channel, service: str = "readiness") -> int:
    """The status `Health/Check` answers for `service` on `channel`."""
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    return reply.status


async def health_status_at(port: int, service: str = "readiness", tls: bool = False) -> int:
    """The same, over a fresh channel to 127.0.0.1:`port`: plaintext, or with
    `tls` trusting whatever certificate the server shows (as Envoy does)."""
    target = f"127.0.0.1:{port}"
    if not tls:
        async with grpc.aio.insecure_channel(target) as channel:
            return await health_status(channel, service)
    certificate = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    credentials = grpc.ssl_channel_credentials(root_certificates=certificate.encode())
    async with grpc.aio.secure_channel(target, credentials) as channel:
        return await health_status(channel, service)
