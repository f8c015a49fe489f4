"""gRPC health (Check and Watch) from one state, served by epp.transport, as grpcio sees it."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.serve.health import NOT_SERVING, SERVICE_UNKNOWN, SERVING, Health
from epp.transport import HEALTH_LIMITS, GrpcServer
from tests.support.waiting import eventually


@pytest.fixture
async def health_channel():
    health = Health()
    await health.start()
    server = GrpcServer(health.routes(), limits=HEALTH_LIMITS)
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield health, health_pb2_grpc.HealthStub(channel)
    await server.stop(grace=None)


async def test_check_answers_the_current_status(health_channel):
    health, stub = health_channel
    request = health_pb2.HealthCheckRequest(service="readiness")
    assert (await stub.Check(request)).status == NOT_SERVING
    await health.set_ready()
    assert (await stub.Check(request)).status == SERVING


async def test_check_of_an_unknown_service_is_not_found(health_channel):
    _, stub = health_channel
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_sends_the_status_then_each_change(health_channel):
    health, stub = health_channel
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="readiness"))
    assert (await watch.read()).status == NOT_SERVING
    await health.set_ready()
    assert (await watch.read()).status == SERVING
    await health.shutting_down()
    assert (await watch.read()).status == NOT_SERVING
    watch.cancel()


async def test_watch_of_an_unknown_service_says_so_and_stays_open(health_channel):
    health, stub = health_channel
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="nope"))
    assert (await watch.read()).status == SERVICE_UNKNOWN
    # A later call's answer comes after anything the server said to the watch.
    await stub.Check(health_pb2.HealthCheckRequest(service="liveness"))
    assert not watch.done()
    assert "nope" in health._watches
    watch.cancel()


async def test_a_cancelled_watch_is_forgotten(health_channel):
    health, stub = health_channel
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="liveness"))
    assert (await watch.read()).status == SERVING
    watch.cancel()
    await eventually(lambda: health._watches == {})
