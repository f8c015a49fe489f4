"""Pool-less cluster mode (`--endpoint-selector` + `--endpoint-target-ports`):
the pods a label selector picks are the endpoints; no InferencePool and no
InferenceObjectives are read."""

from __future__ import annotations

from tests.support.kube import KubeEmulator, StartEpp, objective, pod, pool
from tests.support.waiting import eventually

SELECTOR = "app=vllm,tier in (gold, silver),!draining"


def seed(kube: KubeEmulator) -> None:
    kube.apply(pod("gold-1", "10.0.0.1", {"app": "vllm", "tier": "gold"}))
    kube.apply(pod("silver-1", "10.0.0.2", {"app": "vllm", "tier": "silver"}))
    kube.apply(pod("bronze-1", "10.0.0.3", {"app": "vllm", "tier": "bronze"}))
    kube.apply(pod("gold-2", "10.0.0.4", {"app": "vllm", "tier": "gold", "draining": "y"}))
    kube.apply(pod("gold-3", "10.0.0.5", {"app": "vllm", "tier": "gold"}, ready=False))


async def test_the_selected_pods_are_endpoints_on_every_target_port(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp(endpoint_selector=SELECTOR, target_ports=(8000, 8001))
    assert epp.addresses() == {"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"}


async def test_ready_without_any_inference_pool(kube, start_epp: StartEpp):
    epp = await start_epp(endpoint_selector="app=vllm", target_ports=(8000,))
    assert epp.mode.ready.is_set()
    assert epp.addresses() == set()


async def test_neither_pools_nor_objectives_are_read(kube, start_epp: StartEpp):
    kube.apply(pool(selector={"app": "vllm"}))
    kube.apply(objective("premium", priority=10))
    seed(kube)
    epp = await start_epp(endpoint_selector="app=vllm", target_ports=(8000,))
    assert epp.registry.get("premium") is None
    await eventually(lambda: kube.open_watches() == 1)
    assert [query.get("labelSelector") for query in kube.watch_requests] == ["app=vllm"]
    assert [query.get("labelSelector") for query in kube.list_requests] == ["app=vllm"]


async def test_pods_follow_their_labels_and_readiness(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp(endpoint_selector=SELECTOR, target_ports=(8000,))
    kube.apply(pod("bronze-1", "10.0.0.3", {"app": "vllm", "tier": "gold"}))
    kube.apply(pod("gold-3", "10.0.0.5", {"app": "vllm", "tier": "gold"}))
    kube.apply(pod("gold-1", "10.0.0.1", {"app": "vllm", "tier": "gold", "draining": "y"}))
    await eventually(lambda: epp.addresses() == {"10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.5:8000"})
