"""The entry point `epp serve` uses: a kubeconfig, readiness, a clean stop."""

from __future__ import annotations

import asyncio

from epp.api.registry import ObjectiveRegistry
from epp.datalayer.store import EndpointStore
from epp.k8s.cluster import ClusterSettings, cluster_mode
from epp.k8s.leader import lease_name
from tests.support.kube import (
    FAST_LEASE,
    FAST_WATCH,
    objective,
    pod,
    pool,
)
from tests.support.waiting import eventually


async def test_cluster_mode_from_a_kubeconfig_syncs_leads_and_releases_on_exit(kube, tmp_path):
    kube.apply(pool())
    kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}))
    kube.apply(objective("premium", priority=10))
    settings = ClusterSettings("pool-a", identity="epp-1", lease=FAST_LEASE, watch=FAST_WATCH)
    store = EndpointStore()
    published: list[list[int]] = []

    def registry(pool_object):
        return ObjectiveRegistry(pool_object, publish=published.append)

    path = kube.write_kubeconfig(tmp_path / "kubeconfig")
    async with cluster_mode(settings, registry, store, kube_config=path) as mode:
        await asyncio.wait_for(mode.ready.wait(), 3)
        assert store.addresses() == ["10.0.0.1:8000"]
        assert published[-1] == [0, 10]
        await eventually(lambda: mode.is_leader)
        await eventually(lambda: len(kube.status_writes()) == 1)
    lease = kube.get("coordination.k8s.io/v1", "Lease", lease_name("default", "pool-a"))
    assert lease["spec"]["holderIdentity"] == ""
    await eventually(lambda: kube.open_watches() == 0)
