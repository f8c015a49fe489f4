"""Leader election on a coordination.k8s.io/v1 Lease, against the emulator."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import CoordinationV1Api

from epp.k8s.leader import LeaderElector, lease_name
from tests.support.kube import FAST_LEASE, KubeEmulator, StartEpp, caught_up, objective, pool
from tests.support.waiting import eventually

LEASE = lease_name("default", "pool-a")


@pytest.fixture
async def electors(kube: KubeEmulator) -> AsyncIterator[list[tuple[LeaderElector, asyncio.Task]]]:
    async with kube.api_client() as api:
        coordination = CoordinationV1Api(api)
        pairs = []
        for identity in ("epp-1", "epp-2"):
            elector = LeaderElector(coordination, LEASE, "default", identity, FAST_LEASE)
            pairs.append((elector, asyncio.create_task(elector.run())))
        yield pairs
        for _, task in pairs:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def leaders(pairs: list[tuple[LeaderElector, asyncio.Task]]) -> list[LeaderElector]:
    return [elector for elector, _ in pairs if elector.is_leader]


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_exactly_one_candidate_leads_and_holds_the_lease(kube, electors):
    await eventually(lambda: len(leaders(electors)) == 1)
    for _ in range(50):
        assert len(leaders(electors)) <= 1
        await asyncio.sleep(0.01)
    [leader] = leaders(electors)
    lease = kube.get("coordination.k8s.io/v1", "Lease", LEASE)
    assert lease["spec"]["holderIdentity"] == leader.identity
    assert LEASE == "epp-default-pool-a.gateway-api-inference-extension.sigs.k8s.io"


async def test_a_released_lease_is_taken_over_before_it_would_expire(kube, electors):
    await eventually(lambda: len(leaders(electors)) == 1)
    [(leader, task)] = [pair for pair in electors if pair[0].is_leader]
    await stop(task)
    released_at = time.monotonic()
    await leader.release()
    await eventually(lambda: len(leaders(electors)) == 1)
    assert not leader.is_leader
    assert time.monotonic() - released_at < FAST_LEASE.lease_duration / 2


async def test_a_vanished_leader_is_replaced_after_the_lease_expires(kube, electors):
    await eventually(lambda: len(leaders(electors)) == 1)
    [(leader, task)] = [pair for pair in electors if pair[0].is_leader]
    await stop(task)
    vanished_at = time.monotonic()
    [(successor, _)] = [pair for pair in electors if pair[0] is not leader]
    await eventually(lambda: successor.is_leader, timeout=3 * FAST_LEASE.lease_duration)
    assert time.monotonic() - vanished_at >= FAST_LEASE.lease_duration - FAST_LEASE.retry_period
    lease = kube.get("coordination.k8s.io/v1", "Lease", LEASE)
    assert lease["spec"]["leaseTransitions"] == 1


async def test_only_the_leader_writes_status(kube: KubeEmulator, start_epp: StartEpp):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    first = await start_epp(identity="epp-1", leader_election=True)
    second = await start_epp(identity="epp-2", leader_election=True)
    await eventually(lambda: first.mode.is_leader or second.mode.is_leader)
    await eventually(lambda: len(kube.status_writes()) == 1)
    await caught_up(kube, first, second)
    follower = second if first.mode.is_leader else first
    assert follower.mode.status.writes == 0
    assert len(kube.status_writes()) == 1


async def test_a_leader_that_cannot_renew_steps_down(kube: KubeEmulator, electors):
    await eventually(lambda: len(leaders(electors)) == 1)
    kube.fail("/leases")
    started = time.monotonic()
    await eventually(lambda: not leaders(electors), timeout=3 * FAST_LEASE.renew_deadline)
    assert time.monotonic() - started >= FAST_LEASE.renew_deadline - FAST_LEASE.retry_period
    kube.heal()
    await eventually(lambda: len(leaders(electors)) == 1, timeout=3 * FAST_LEASE.lease_duration)
