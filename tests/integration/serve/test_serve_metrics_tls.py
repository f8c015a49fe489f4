"""Metrics bookkeeping (fairness-id cap, collected flows) and TLS on the ext_proc port."""

from __future__ import annotations

import asyncio
import ssl

import grpc
import pytest
from grpc_health.v1 import health_pb2

from epp.extproc.events import Rejected, Release
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.request import InferenceRequest
from epp.serve.metrics import EppMetrics
from epp.serve.server import EppServer, ServeOptions
from epp.serve.tls import self_signed_certificate
from tests.support.health import health_status

QUEUE = "inference_extension_flow_control_request_queue_duration_seconds_count"


def finished(fairness_id: str, outcome: Outcome = Outcome.DISPATCHED) -> FlowRequest:
    request = FlowRequest("r", fairness_id, 3, arrival=1.0, payload=InferenceRequest("m", "t"))
    request.outcome = outcome
    return request


def fairness_ids(metrics: EppMetrics) -> set[str]:
    return {
        sample.labels["fairness_id"]
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == QUEUE
    }


def test_fairness_ids_beyond_the_cap_are_reported_as_other():
    metrics = EppMetrics("pool", fairness_id_limit=2)
    for tenant in ("a", "b", "c", "d"):
        metrics.on_outcome(finished(tenant), 2.0)
    assert fairness_ids(metrics) == {"a", "b", "other"}


def test_a_collected_flow_loses_its_series_and_frees_its_slot():
    metrics = EppMetrics("pool", fairness_id_limit=1)
    metrics.on_outcome(finished("a"), 2.0)
    metrics.on_flows_collected([FlowKey("a", 3)])
    assert fairness_ids(metrics) == set()
    metrics.on_outcome(finished("b"), 2.0)
    assert fairness_ids(metrics) == {"b"}


def test_running_requests_go_up_at_dispatch_and_down_at_completion():
    metrics = EppMetrics("pool")
    request = finished("a")
    metrics.on_outcome(request, 2.0)
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_running_requests", {"model_name": "m"}
        )
        == 1
    )
    metrics.on_complete(request)
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_running_requests", {"model_name": "m"}
        )
        == 0
    )


def test_a_release_records_duration_and_tokens():
    metrics = EppMetrics("pool")
    request = finished("a")
    metrics.on_stream_event(Release(request, 10, 4))
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_output_tokens_sum", {"model_name": "m", "target_model_name": "t"}
        )
        == 4
    )


def test_errors_are_counted_by_reason():
    metrics = EppMetrics("pool")
    metrics.on_stream_event(
        Rejected(429, "rejected-saturated", finished("a", Outcome.REJECTED_SATURATED))
    )
    labels = {"model_name": "m", "target_model_name": "t", "error_code": "rejected-saturated"}
    assert metrics.registry.get_sample_value("inference_objective_request_error_total", labels) == 1


@pytest.fixture
def cert_dir(tmp_path):
    certificate, key = self_signed_certificate("localhost")
    (tmp_path / "tls.crt").write_bytes(certificate)
    (tmp_path / "tls.key").write_bytes(key)
    return tmp_path, certificate


async def test_secure_serving_with_given_files_speaks_tls_on_the_ext_proc_port(cert_dir):
    cert_path, certificate = cert_dir
    server = EppServer(
        ServeOptions(
            grpc_port=0,
            grpc_health_port=0,
            metrics_port=0,
            bind_address="127.0.0.1",
            endpoints="127.0.0.1:1",
            secure_serving=True,
            cert_path=str(cert_path),
            drain_timeout=0.1,
        )
    )
    await server.start()
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate)
        target = f"localhost:{server.ports['grpc']}"
        async with grpc.aio.secure_channel(target, credentials) as channel:
            assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(target) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_status(channel)
    finally:
        await server.stop()


async def test_secure_serving_without_files_makes_a_self_signed_certificate():
    server = EppServer(
        ServeOptions(
            grpc_port=0,
            grpc_health_port=0,
            metrics_port=0,
            bind_address="127.0.0.1",
            endpoints="127.0.0.1:1",
            drain_timeout=0.1,
        )
    )
    await server.start()
    try:
        port = server.ports["grpc"]
        certificate = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate.encode())
        async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
            assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop()
