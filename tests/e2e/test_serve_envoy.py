"""Envoy -> `epp serve` (a subprocess) -> a fake vLLM upstream, all on loopback.

One upstream with one in-flight credit (`maxPerEndpoint: 1`): a request whose
prompt starts with "hold" saturates the pool until the upstream releases it,
so what is sent next queues in the EPP. Objectives come from a file the
tests rewrite while the EPP runs.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from tests.support.envoy import running_envoy
from tests.support.epp_process import objectives_yaml, running_epp
from tests.support.fake_vllm import running_fake_vllm
from tests.support.health import health_status_at
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

MAX_BODY = 4096
CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  priorityBands:
  - priority: 5
    maxRequests: 1
  gate:
    kinds: [concurrency]
    maxPerEndpoint: 1
"""


def objectives(**priorities: int) -> str:
    return objectives_yaml("e2e-pool", **priorities)


BASE_OBJECTIVES = {"low": 0, "high": 10, "tiny": 5, "x": 1}


class Stack:
    def __init__(self, url, epp, upstream, objectives_file: Path) -> None:
        self.url = url
        self.epp = epp
        self.upstream = upstream
        self.objectives_file = objectives_file
        self.reloads_seen = 0

    def write_objectives(self, text: str) -> None:
        temporary = self.objectives_file.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(self.objectives_file)

    async def wait_for_log(self, pattern: str, count: int, timeout: float = 10.0) -> None:
        await eventually(lambda: len(re.findall(pattern, self.epp.log())) >= count, timeout)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    (folder / "config.yaml").write_text(CONFIG)
    objectives_file = folder / "objectives.yaml"
    objectives_file.write_text(objectives(**BASE_OBJECTIVES))
    async with (
        running_fake_vllm() as upstream,
        running_epp(
            f"--config-file={folder / 'config.yaml'}",
            f"--objectives={objectives_file}",
            "--pool-name=e2e-pool",
            f"--endpoints={upstream.address}",
            f"--max-body-bytes={MAX_BODY}",
            "--file-watch-interval=50ms",
        ) as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        yield Stack(url, epp, upstream, objectives_file)


@pytest_asyncio.fixture(loop_scope="module")
async def session(stack):
    stack.upstream.release.clear()
    stack.upstream.received.clear()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        yield client
    stack.upstream.release.set()


async def post(session, url, prompt="p", objective=None, body=None):
    headers = {"x-llm-d-inference-objective": objective} if objective else {}
    data = body if body is not None else json.dumps({"model": "m", "prompt": prompt}).encode()
    async with session.post(url, data=data, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


async def metric_value(session, stack, name: str, **labels: str) -> float:
    async with session.get(stack.epp.metrics_url) as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def hold(session, stack) -> asyncio.Task:
    holder = asyncio.create_task(post(session, stack.url, "hold"))
    await eventually(
        lambda: any(r["prompt"] == "hold" for r in stack.upstream.received), timeout=10
    )
    return holder


async def test_request_reaches_the_endpoint_the_epp_picked(stack, session):
    status, _, body = await post(session, stack.url)
    assert status == 200
    (received,) = stack.upstream.received
    assert received["destination"] == stack.upstream.address
    assert json.loads(body)["served_by"] == stack.upstream.address


async def test_control_headers_are_removed_before_the_upstream(stack, session):
    status, _, _ = await post(session, stack.url, objective="high")
    assert status == 200
    assert "x-llm-d-inference-objective" not in stack.upstream.received[0]["headers"]


async def test_invalid_json_gets_400(stack, session):
    status, _, body = await post(session, stack.url, body=b"{not json")
    assert status == 400
    assert b"bad request" in body
    assert stack.upstream.received == []


async def test_body_over_max_body_bytes_gets_413(stack, session):
    big = json.dumps({"model": "m", "prompt": "x" * MAX_BODY * 2}).encode()
    status, _, _ = await post(session, stack.url, body=big)
    assert status == 413
    assert stack.upstream.received == []


async def test_full_band_rejects_with_429_rejected_saturated(stack, session):
    holder = await hold(session, stack)
    first = asyncio.create_task(post(session, stack.url, "t1", "tiny"))
    await stack.epp.wait_queued(session, 1)
    status, headers, _ = await post(session, stack.url, "t2", "tiny")
    assert (status, headers.get("x-llm-d-request-dropped-reason")) == (429, "rejected-saturated")
    stack.upstream.release.set()
    assert (await holder)[0] == (await first)[0] == 200


async def test_higher_priority_sent_after_lower_is_answered_first(stack, session):
    holder = await hold(session, stack)
    lows = [asyncio.create_task(post(session, stack.url, f"low{i}", "low")) for i in range(3)]
    await stack.epp.wait_queued(session, 3)
    highs = [asyncio.create_task(post(session, stack.url, f"high{i}", "high")) for i in range(3)]
    await stack.epp.wait_queued(session, 6)
    stack.upstream.release.set()
    statuses = [status for status, _, _ in await asyncio.gather(holder, *lows, *highs)]
    assert statuses == [200] * 7
    order = [r["prompt"] for r in stack.upstream.received[1:]]
    assert order == ["high0", "high1", "high2", "low0", "low1", "low2"]


async def test_priority_change_in_the_objectives_file_applies_without_losing_queued(stack, session):
    holder = await hold(session, stack)
    before = asyncio.create_task(post(session, stack.url, "x-before", "x"))
    high = asyncio.create_task(post(session, stack.url, "high", "high"))
    await stack.epp.wait_queued(session, 2)
    stack.write_objectives(objectives(**{**BASE_OBJECTIVES, "x": 20}))
    await stack.wait_for_log(r"reloaded the objectives", 1)
    after = asyncio.create_task(post(session, stack.url, "x-after", "x"))
    await stack.epp.wait_queued(session, 3)
    stack.upstream.release.set()
    statuses = [s for s, _, _ in await asyncio.gather(holder, before, high, after)]
    assert statuses == [200] * 4
    assert [r["prompt"] for r in stack.upstream.received[1:]] == ["x-after", "high", "x-before"]


async def test_invalid_objectives_change_is_refused_and_the_last_good_state_stays(stack, session):
    stack.write_objectives(objectives(**{**BASE_OBJECTIVES, "x": 7}))
    await stack.wait_for_log(r"reloaded the objectives", 2)
    broken = objectives(**BASE_OBJECTIVES).replace("priority: 1\n", "priority: high\n")
    stack.write_objectives(broken)
    await stack.wait_for_log(r"refused the change to the objectives", 1)
    log = stack.epp.log()
    assert f"{stack.objectives_file}[3]" in log
    assert "spec.priority" in log
    before = await metric_value(session, stack, "llm_d_epp_request_total", priority="7")
    status, _, _ = await post(session, stack.url, "x", "x")
    assert status == 200
    after = await metric_value(session, stack, "llm_d_epp_request_total", priority="7")
    assert after == before + 1


@pytest.mark.parametrize("port", ["grpc_health", "grpc"])
@pytest.mark.parametrize(
    "service",
    [
        "",
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
        "inference-extension",
    ],
)
async def test_health_is_serving_once_loaded(stack, port, service):
    status = await health_status_at(stack.epp.ports[port], service, tls=port == "grpc")
    assert status == health_pb2.HealthCheckResponse.SERVING


async def test_metrics_port_serves_the_reference_names(stack, session):
    assert (await post(session, stack.url, "m", "high"))[0] == 200
    assert (await post(session, stack.url, body=b"nope"))[0] == 400
    async with session.get(stack.epp.metrics_url) as response:
        assert response.status == 200
        samples = [
            (sample.name, sample.labels)
            for family in text_string_to_metric_families(await response.text())
            for sample in family.samples
        ]
    model = {"model_name": "m", "target_model_name": "m"}
    request = {**model, "fairness_id": "default-flow", "priority": "10"}
    flow = {"fairness_id": "default-flow", "priority": "10", "inference_pool": "e2e-pool"}
    unparsed = {"model_name": "", "target_model_name": "", "error_code": "BadRequest"}
    dispatched = {**flow, **model, "outcome": "Dispatched"}
    expected = [
        ("llm_d_epp_request_total", request),
        ("inference_objective_request_total", {**model, "priority": "10"}),
        ("llm_d_epp_request_error_total", unparsed),
        ("inference_objective_request_error_total", unparsed),
        ("llm_d_epp_request_duration_seconds_count", request),
        ("inference_objective_request_duration_seconds_count", model),
        ("llm_d_epp_request_input_tokens_count", request),
        ("inference_objective_input_tokens_count", model),
        ("llm_d_epp_request_output_tokens_count", request),
        ("inference_objective_output_tokens_count", model),
        ("llm_d_epp_request_running", request),
        ("inference_objective_running_requests", {"model_name": "m"}),
        ("llm_d_epp_flow_control_request_queue_duration_seconds_count", dispatched),
        ("inference_extension_flow_control_request_queue_duration_seconds_count", dispatched),
        (
            "llm_d_epp_flow_control_requests_total",
            {"outcome": "Dispatched", "priority": "10", "inference_pool": "e2e-pool"},
        ),
        ("llm_d_epp_scheduler_e2e_duration_seconds_count", {}),
        ("inference_extension_scheduler_e2e_duration_seconds_count", {}),
        ("llm_d_epp_ready_endpoints", {"name": "e2e-pool"}),
        ("inference_pool_ready_pods", {"name": "e2e-pool"}),
        ("llm_d_epp_flow_control_pool_saturation", {"inference_pool": "e2e-pool"}),
        ("inference_extension_flow_control_pool_saturation", {"inference_pool": "e2e-pool"}),
    ]
    for name, labels in expected:
        assert any(n == name and labels.items() <= found.items() for n, found in samples), (
            name,
            labels,
        )
