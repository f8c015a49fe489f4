"""`epp serve` started with the flags the reference's Helm chart renders, in
cluster mode against the emulated API server, with the chart's own
`default-plugins.yaml`, behind a real Envoy that speaks TLS to it (as the
chart's gateway does).

The flags are written down from llm-d-router
`config/charts/routerlib/templates/_deployment.yaml` (commit ebab6879,
2026-08-22), rendered with the charts' defaults: release `router` in namespace
`default`, one replica (no `--ha-enable-leader-election`), tracing off,
Prometheus auth on (no `--metrics-endpoint-auth=false`), model server type
vllm. Two substitutions, for a test on a shared machine: the config file path
(`/config/default-plugins.yaml` in the pod) points at that file's content
written here, and the health port 9003 is 0 (a free port). The pod's env (`NAMESPACE`,
`POD_NAME`) is set as the chart sets it; `KUBECONFIG` stands in for the
in-cluster service account.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from grpc_health.v1 import health_pb2

from tests.support.dashboards import read_page, unmet
from tests.support.envoy import RunningEnvoy, running_envoy
from tests.support.epp_process import RunningEpp, running_epp
from tests.support.fake_vllm import FakeVllm, running_fake_vllm
from tests.support.health import health_status_at
from tests.support.kube import KubeEmulator, pod, pool
from tests.support.promql import reads

pytestmark = pytest.mark.envoy

CHART_CONFIG_FILE = "/config/default-plugins.yaml"
CHART_HEALTH_PORT = "9003"
POOL_MODE_FLAGS = (
    # router.inferencePool.create unset: the InferencePool branch
    "--pool-name", "router",
    "--pool-namespace", "default",
    "--pool-group", "inference.networking.k8s.io",
    "--zap-encoder", "json",
    "--config-file", CHART_CONFIG_FILE,
    "--grpc-health-port", CHART_HEALTH_PORT,
    "--tracing=false",
)  # fmt: skip
POOL_LESS_FLAGS = (
    # llm-d-router-standalone (router.inferencePool.create: false), with
    # modelServers.matchLabels {app: vllm} and targetPorts [{number: PORT}]
    "--endpoint-selector", "app=vllm",
    "--endpoint-target-ports", "PORT",
    "--zap-encoder", "json",
    "--config-file", CHART_CONFIG_FILE,
    "--grpc-health-port", CHART_HEALTH_PORT,
    "--tracing=false",
)  # fmt: skip
DEFAULT_PLUGINS = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: "http"
    path: "/metrics"
    insecureSkipVerify: true
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
"""The chart's `default-plugins.yaml` (`templates/_config.yaml`, same commit)
rendered with its defaults: model server type vllm over http, no parsers, no
latency predictor."""
PROMETHEUS_TOKEN = "prometheus-token"
DASHBOARD_QUERIES = {
    "Overall Error Rate": "sum(rate(llm_d_epp_request_error_total[5m])) "
    "/ sum(rate(llm_d_epp_request_total[5m]))",
    "Request Rate": "sum by(model_name) (rate(llm_d_epp_request_total[5m]))",
    "Overall Latency P99": "histogram_quantile(0.99, sum by(le) "
    "(rate(llm_d_epp_request_duration_seconds_bucket[5m])))",
    "EPP E2E Latency P99": "histogram_quantile(0.99, sum by(le) "
    "(rate(llm_d_epp_scheduler_e2e_duration_seconds_bucket[5m])))",
    "QPS per endpoint": "sum by(endpoint_name) "
    '(rate(llm_d_epp_scheduler_attempts_total{status="success"}[5m]))',
    "Queue wait time P99": "histogram_quantile(0.99, sum by(le) "
    "(rate(llm_d_epp_flow_control_request_queue_duration_seconds_bucket[5m])))",
    "Pool saturation": "llm_d_epp_flow_control_pool_saturation",
}
"""Queries of llm-d's PromQL query reference (its monitoring docs), which its
Grafana dashboards are built on."""
SERVING = health_pb2.HealthCheckResponse.SERVING


def chart_flags(flags: tuple[str, ...], config_file: str, port: int = 0) -> list[str]:
    substitutions = {CHART_CONFIG_FILE: config_file, CHART_HEALTH_PORT: "0", "PORT": str(port)}
    return [substitutions.get(flag, flag) for flag in flags]


CHART_PROBE_SERVICE = "inference-extension"
"""What the chart's liveness and readiness probes ask the health port with one replica."""


async def wait_ready(epp: RunningEpp) -> None:
    """Until the chart's readiness probe passes (the cluster state is synced)."""
    async with asyncio.timeout(10):
        while await health_status_at(epp.ports["grpc_health"], CHART_PROBE_SERVICE) != SERVING:
            await asyncio.sleep(0.05)


async def request_through_envoy(envoy_port: int) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{envoy_port}/v1/completions"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={"model": "m", "prompt": "hello"}) as response,
    ):
        return response.status, await response.read()


async def bad_request_through_envoy(envoy_port: int) -> int:
    url = f"http://127.0.0.1:{envoy_port}/v1/completions"
    async with aiohttp.ClientSession() as session, session.post(url, data=b"{") as response:
        return response.status


async def scrape(url: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.text()


def cluster(kube: KubeEmulator, tmp_path) -> dict[str, str]:
    """The pod's environment, with the emulator as its API server."""
    kube.apply(pod("vllm-0", "127.0.0.1", {"app": "vllm"}))
    kube.add_token(PROMETHEUS_TOKEN, "system:serviceaccount:monitoring:prometheus")
    kube.allow("system:serviceaccount:monitoring:prometheus")
    return {
        "KUBECONFIG": kube.write_kubeconfig(tmp_path / "kubeconfig"),
        "NAMESPACE": "default",
        "POD_NAME": "router-epp-6c9f8d7b5-k2x4z",
    }


@dataclass(slots=True)
class ChartPod:
    upstream: FakeVllm
    epp: RunningEpp
    envoy: RunningEnvoy


@contextlib.asynccontextmanager
async def chart_pod(
    tmp_path, flags: tuple[str, ...], inference_pool: bool
) -> AsyncIterator[ChartPod]:
    """`epp serve` with the chart's `flags` and its config file, in the
    emulated cluster with one fake vLLM pod (and the InferencePool the pool
    flags name), behind Envoy, once the chart's readiness probe passes."""
    config = tmp_path / "default-plugins.yaml"
    config.write_text(DEFAULT_PLUGINS)
    async with KubeEmulator() as kube, running_fake_vllm() as upstream:
        upstream_port = int(upstream.address.rsplit(":", 1)[1])
        env = cluster(kube, tmp_path)
        if inference_pool:
            kube.apply(pool("router", selector={"app": "vllm"}, ports=(upstream_port,)))
        async with (
            running_epp(*chart_flags(flags, str(config), upstream_port), env=env) as epp,
            running_envoy(epp_port=epp.ports["grpc"]) as envoy,
        ):
            await wait_ready(epp)
            yield ChartPod(upstream, epp, envoy)


def selected(exposition: str, query: str) -> list[str]:
    """What `exposition` lacks for the EPP series `query` reads."""
    page = read_page(exposition)
    return [missing for selector in reads(query) for missing in unmet(selector, page)]


def json_log_lines(log: str) -> list[dict]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


async def test_the_charts_pool_flags_start_a_serving_epp(tmp_path):
    async with chart_pod(tmp_path, POOL_MODE_FLAGS, inference_pool=True) as chart:
        status, body = await request_through_envoy(chart.envoy.listen_port)
        assert status == 200, body
        assert chart.upstream.received
        assert (await bad_request_through_envoy(chart.envoy.listen_port)) == 400
        assert await scrape(chart.epp.metrics_url, None) == (401, "Unauthorized\n")
        status, exposition = await scrape(chart.epp.metrics_url, PROMETHEUS_TOKEN)
        assert status == 200
        for panel, query in DASHBOARD_QUERIES.items():
            assert selected(exposition, query) == [], panel
        log = chart.epp.log()
    lines = json_log_lines(log)
    assert lines and all({"level", "ts", "logger", "msg"} <= line.keys() for line in lines)
    # The chart writes llm-d.ai/v1alpha1, which the reference's newest release warns about too.
    warnings = [line["msg"] for line in lines if line["level"] == "warning"]
    assert warnings == [
        "configuration: apiVersion: llm-d.ai/v1alpha1 is deprecated; use llm-d.ai/v1"
    ]
    assert any("tls" in line["msg"] and "cluster mode" in line["msg"] for line in lines)


async def test_the_standalone_charts_flags_serve_the_selected_pods(tmp_path):
    async with chart_pod(tmp_path, POOL_LESS_FLAGS, inference_pool=False) as chart:
        status, body = await request_through_envoy(chart.envoy.listen_port)
        assert status == 200, body
        assert chart.upstream.received
