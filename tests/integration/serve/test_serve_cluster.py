"""EppServer in cluster mode (`--pool-name` without `--endpoints`) against
the emulated API server: readiness waits for the sync, then pods are
endpoints and objectives give priorities."""

from __future__ import annotations

import datetime

from grpc_health.v1 import health_pb2

from epp.k8s.leader import lease_name, micro_time
from tests.support.health import health_status_at
from tests.support.kube import KubeEmulator, objective, pod, pool
from tests.support.serving import serving
from tests.support.waiting import eventually


async def test_cluster_mode_is_ready_after_sync_with_pods_and_objectives(tmp_path):
    async with KubeEmulator() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        async with serving(pool_name="pool-a", kubeconfig=kubeconfig) as server:
            port = server.ports["grpc_health"]
            assert await health_status_at(port) == health_pb2.HealthCheckResponse.NOT_SERVING
            kube.apply(pool())
            kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}))
            kube.apply(objective("premium", priority=10))
            await eventually(lambda: server.health.ready, timeout=5)
            assert await health_status_at(port) == health_pb2.HealthCheckResponse.SERVING
            await eventually(lambda: server.store.addresses() == ["10.0.0.1:8000"])
            await eventually(
                lambda: server.priority_of({"x-llm-d-inference-objective": "premium"}) == 10
            )


async def test_pool_less_mode_serves_the_selected_pods(tmp_path, monkeypatch):
    monkeypatch.setenv("POD_NAME", "router-epp-5d8f7c9b4-x2x7q")
    async with KubeEmulator() as kube:
        kube.apply(pod("a-1", "10.0.0.1", {"app": "vllm"}))
        kube.apply(pod("b-1", "10.0.0.2", {"app": "other"}))
        async with serving(
            endpoint_selector="app=vllm",
            endpoint_target_ports=(8000, 8001),
            kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig"),
        ) as server:
            await eventually(lambda: server.health.ready, timeout=5)
            assert sorted(server.store.addresses()) == ["10.0.0.1:8000", "10.0.0.1:8001"]
            assert server.metrics.pool_name == "router-epp"


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def held_lease(holder: str) -> dict:
    now = micro_time(datetime.datetime.now(datetime.UTC))
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease_name("default", "pool-a"), "namespace": "default"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
        },
    }


async def test_with_leader_election_only_the_leader_is_ready(tmp_path):
    async with KubeEmulator() as kube:
        kube.apply(pool())
        kube.apply(held_lease("another-replica"))
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        async with serving(
            pool_name="pool-a", kubeconfig=kubeconfig, ha_enable_leader_election=True
        ) as server:
            await eventually(lambda: server._mode is not None and server._mode.ready.is_set())
            # The elector has read the lease another replica holds.
            await eventually(lambda: server._mode.elector.holder == "another-replica")
            port = server.ports["grpc_health"]
            assert await health_status_at(port, "readiness") == NOT_SERVING
            assert await health_status_at(port, "") == NOT_SERVING
            assert await health_status_at(port, "liveness") == SERVING


async def test_with_leader_election_the_leader_is_ready(tmp_path):
    async with KubeEmulator() as kube:
        kube.apply(pool())
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        async with serving(
            pool_name="pool-a", kubeconfig=kubeconfig, ha_enable_leader_election=True
        ) as server:
            await eventually(lambda: server.health.ready, timeout=5)
            assert server._mode is not None and server._mode.is_leader
            port = server.ports["grpc_health"]
            assert await health_status_at(port, "readiness") == SERVING
