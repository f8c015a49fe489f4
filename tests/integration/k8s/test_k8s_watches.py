"""Cluster mode against an emulated API server: what the EPP sees of its pool,
its pods and the namespace's objectives, and how it survives broken watches."""

from __future__ import annotations

import asyncio
import logging

from tests.support.kube import KubeEmulator, StartEpp, objective, pod, pool
from tests.support.waiting import eventually


def seed(kube: KubeEmulator) -> None:
    kube.apply(pool())
    kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}))
    kube.apply(pod("a-2", "10.0.0.2", {"app": "pool-a"}, ready=False))
    kube.apply(pod("other", "10.0.0.9", {"app": "other"}))
    kube.apply(objective("premium", priority=10))


async def test_ready_after_pool_pods_and_objectives_are_listed(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    assert epp.addresses() == {"10.0.0.1:8000"}
    assert epp.registry.get("premium").priority == 10
    assert epp.mode.pool.name == "pool-a"


async def test_not_ready_while_the_pool_does_not_exist(kube, start_epp: StartEpp):
    kube.apply(objective("premium", priority=10))
    epp = await start_epp(wait_ready=False)
    # Both lists are in (the pool's empty): readiness has been decided.
    await eventually(lambda: epp.mode.objective_reflector.synced.is_set())
    await eventually(lambda: epp.mode.pool_reflector.synced.is_set())
    assert not epp.mode.ready.is_set()
    kube.apply(pool())
    await asyncio.wait_for(epp.mode.ready.wait(), 3)


async def test_objectives_are_read_through_the_storage_version(kube, start_epp, caplog):
    caplog.set_level(logging.INFO, logger="epp.k8s.cluster")
    seed(kube)
    await start_epp()
    assert "reading InferenceObjectives through llm-d.ai/v1alpha2" in caplog.text


async def test_a_pool_ref_only_v1alpha2_objective_applies(kube, start_epp: StartEpp):
    seed(kube)
    kube.apply(objective("batch", priority=-5, v1alpha2_pool_ref="pool-a"))
    epp = await start_epp()
    assert epp.registry.get("batch").priority == -5


async def test_a_new_ready_pod_becomes_one_endpoint_per_target_port(kube, start_epp):
    kube.apply(pool(ports=(8000, 8001)))
    epp = await start_epp()
    kube.apply(pod("a-3", "10.0.0.3", {"app": "pool-a"}))
    await eventually(lambda: epp.addresses() == {"10.0.0.3:8000", "10.0.0.3:8001"})
    assert {endpoint.name for endpoint in epp.store.snapshot().endpoints} == {
        "a-3-8000",
        "a-3-8001",
    }


async def test_a_pod_turning_ready_joins_and_turning_unready_leaves(kube, start_epp):
    seed(kube)
    epp = await start_epp()
    kube.apply(pod("a-2", "10.0.0.2", {"app": "pool-a"}, ready=True))
    await eventually(lambda: epp.addresses() == {"10.0.0.1:8000", "10.0.0.2:8000"})
    kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}, ready=False))
    await eventually(lambda: epp.addresses() == {"10.0.0.2:8000"})


async def test_a_terminating_pod_leaves_before_it_is_deleted(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}, deleting=True))
    await eventually(lambda: epp.addresses() == set())


async def test_a_deleted_pod_leaves(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.delete("v1", "Pod", "a-1")
    await eventually(lambda: epp.addresses() == set())


async def test_a_pod_whose_ip_changes_moves_its_endpoint(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.apply(pod("a-1", "10.0.0.7", {"app": "pool-a"}))
    await eventually(lambda: epp.addresses() == {"10.0.0.7:8000"})


async def test_pods_outside_the_selector_never_become_endpoints(kube, start_epp):
    seed(kube)
    epp = await start_epp()
    kube.apply(pod("other-2", "10.0.0.8", {"app": "other"}))
    kube.apply(pod("a-4", "10.0.0.4", {"app": "pool-a"}))
    await eventually(lambda: "10.0.0.4:8000" in epp.addresses())
    assert epp.addresses() == {"10.0.0.1:8000", "10.0.0.4:8000"}


async def test_the_pod_watch_follows_a_pool_selector_change(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.apply(pool(selector={"app": "other"}))
    await eventually(lambda: epp.addresses() == {"10.0.0.9:8000"})
    kube.apply(pod("other-2", "10.0.0.8", {"app": "other"}))
    kube.apply(pod("a-5", "10.0.0.5", {"app": "pool-a"}))
    await eventually(lambda: epp.addresses() == {"10.0.0.9:8000", "10.0.0.8:8000"})
    assert kube.watch_requests[-1]["labelSelector"] == "app=other"


async def test_a_target_port_change_moves_every_endpoint(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.apply(pool(ports=(9000,)))
    await eventually(lambda: epp.addresses() == {"10.0.0.1:9000"})


async def test_a_pool_label_change_reevaluates_pool_selectors(kube, start_epp: StartEpp):
    seed(kube)
    selector = {"matchLabels": {"tier": "gpu"}}
    kube.apply(objective("interactive", priority=5, pools=(), pool_selector=selector))
    epp = await start_epp()
    assert epp.registry.get("interactive") is None
    kube.apply(pool(labels={"tier": "gpu"}))
    await eventually(lambda: epp.registry.get("interactive") is not None)


async def test_a_deleted_pool_leaves_no_endpoints(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.delete("inference.networking.k8s.io/v1", "InferencePool", "pool-a")
    await eventually(lambda: epp.addresses() == set())
    kube.apply(pool())
    await eventually(lambda: epp.addresses() == {"10.0.0.1:8000"})


async def test_objective_create_update_and_delete_reach_the_registry(kube, start_epp):
    seed(kube)
    epp = await start_epp()
    kube.apply(objective("standard", priority=1))
    await eventually(lambda: epp.registry.get("standard") is not None)
    kube.apply(objective("standard", priority=3))
    await eventually(lambda: epp.registry.get("standard").priority == 3)
    kube.delete("llm-d.ai/v1", "InferenceObjective", "standard")
    await eventually(lambda: epp.registry.get("standard") is None)
    assert epp.registry.priorities == {0, 10}


async def test_an_objective_of_another_pool_does_not_apply(kube, start_epp: StartEpp):
    seed(kube)
    kube.apply(objective("elsewhere", priority=7, pools=("pool-b",)))
    epp = await start_epp()
    assert epp.registry.get("elsewhere") is None


async def test_a_dropped_watch_resumes_without_a_relist(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.drop_watches()
    kube.apply(pod("a-3", "10.0.0.3", {"app": "pool-a"}))
    kube.apply(objective("standard", priority=1))
    await eventually(lambda: "10.0.0.3:8000" in epp.addresses())
    await eventually(lambda: epp.registry.get("standard") is not None)
    assert epp.mode.pod_reflector.lists == 1
    assert epp.mode.objective_reflector.lists == 1


async def test_gone_in_the_watch_stream_relists_and_diffs(kube, start_epp: StartEpp):
    seed(kube)
    epp = await start_epp()
    kube.drop_watches()
    kube.delete("v1", "Pod", "a-1")
    kube.apply(pod("a-3", "10.0.0.3", {"app": "pool-a"}))
    kube.delete("llm-d.ai/v1", "InferenceObjective", "premium")
    kube.apply(objective("standard", priority=1))
    kube.compact()
    await eventually(lambda: epp.addresses() == {"10.0.0.3:8000"})
    await eventually(lambda: epp.registry.get("standard") is not None)
    assert epp.registry.get("premium") is None
    assert epp.mode.pod_reflector.lists == 2
    assert epp.mode.objective_reflector.lists == 2


async def test_gone_as_the_watch_http_status_relists(start_epp: StartEpp, kube):
    kube.gone_as_http_status = True
    seed(kube)
    epp = await start_epp()
    kube.drop_watches()
    kube.apply(pod("a-3", "10.0.0.3", {"app": "pool-a"}))
    kube.compact()
    await eventually(lambda: epp.addresses() == {"10.0.0.1:8000", "10.0.0.3:8000"})
    assert epp.mode.pod_reflector.lists == 2


async def test_a_bookmark_moves_the_resume_point_past_compaction(kube, start_epp):
    seed(kube)
    epp = await start_epp()
    await eventually(lambda: kube.open_watches() == 3)
    kube.apply(pod("unrelated", "10.0.0.6", {"app": "other"}))
    bookmarked = kube.bookmark()
    await eventually(lambda: epp.mode.pod_reflector.resource_version == bookmarked)
    kube.compact()
    kube.drop_watches()
    kube.apply(pod("a-3", "10.0.0.3", {"app": "pool-a"}))
    await eventually(lambda: "10.0.0.3:8000" in epp.addresses())
    assert epp.mode.pod_reflector.lists == 1
    assert all(q["allowWatchBookmarks"].lower() == "true" for q in kube.watch_requests)


async def test_an_api_outage_is_retried_and_resumes_without_a_relist(kube, start_epp, caplog):
    seed(kube)
    epp = await start_epp()
    kube.fail("/pods")
    kube.drop_watches()
    kube.apply(pod("a-3", "10.0.0.3", {"app": "pool-a"}))
    await eventually(lambda: "API error 503" in caplog.text)
    assert "10.0.0.3:8000" not in epp.addresses()
    kube.heal()
    await eventually(lambda: "10.0.0.3:8000" in epp.addresses())
    assert epp.mode.pod_reflector.lists == 1
