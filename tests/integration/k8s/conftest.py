"""A fresh emulated API server per test, and EPPs in cluster mode against it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from epp.api.registry import ObjectiveRegistry
from epp.datalayer.store import EndpointStore
from epp.k8s.cluster import ClusterMode, ClusterSettings, cluster_mode
from tests.support.kube import FAST_LEASE, FAST_WATCH, Epp, KubeEmulator, StartEpp


@pytest.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
async def start_epp(kube: KubeEmulator) -> AsyncIterator[StartEpp]:
    """Starts an EPP in cluster mode; every one is stopped at the end."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(
            pool_name: str = "pool-a",
            identity: str = "epp-1",
            leader_election: bool = False,
            wait_ready: bool = True,
            endpoint_selector: str | None = None,
            target_ports: tuple[int, ...] = (),
        ) -> Epp:
            store = EndpointStore()
            api = await stack.enter_async_context(kube.api_client())
            settings = ClusterSettings(
                pool_name=pool_name,
                identity=identity,
                leader_election=leader_election,
                lease=FAST_LEASE,
                watch=FAST_WATCH,
                status_retry=0.05,
                endpoint_selector=endpoint_selector,
                target_ports=target_ports,
            )
            mode = await stack.enter_async_context(
                cluster_mode(settings, ObjectiveRegistry, store, api_client=api)
            )
            if wait_ready:
                await _wait(mode)
            return Epp(mode, store)

        yield start


async def _wait(mode: ClusterMode) -> None:
    async with asyncio.timeout(3):
        await mode.ready.wait()
