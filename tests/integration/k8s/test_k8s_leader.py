"""Leader election on a coordination.k8s.io/v1 Lease, against the emulator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from kubernetes_asyncio.client import CoordinationV1Api

from epp.k8s.leader import LeaderElector, lease_name
from tests.support.kube import FAST_LEASE, KubeEmulator, StartEpp, caught_up, objective, pool
from tests.support.virtual_time import VirtualTime
from tests.support.waiting import eventually

LEASE = lease_name("default", "pool-a")


@dataclass(slots=True)
class Electors:
    pairs: list[tuple[LeaderElector, asyncio.Task]]
    time: VirtualTime

    def leaders(self) -> list[LeaderElector]:
        return [elector for elector, _ in self.pairs if elector.is_leader]

    async def one_leader(self) -> LeaderElector:
        await self.time.run_until(lambda: len(self.leaders()) == 1, FAST_LEASE.lease_duration)
        [leader] = self.leaders()
        return leader

    def task_of(self, elector: LeaderElector) -> asyncio.Task:
        return next(task for each, task in self.pairs if each is elector)


@pytest.fixture
async def electors(kube: KubeEmulator) -> AsyncIterator[Electors]:
    """Two candidates on virtual time: durations are exact, and every state
    they pass through is seen between their steps."""
    pairs: list[tuple[LeaderElector, asyncio.Task]] = []
    time = VirtualTime(lambda: sum(not task.done() for _, task in pairs))
    async with kube.api_client() as api:
        coordination = CoordinationV1Api(api)
        for identity in ("epp-1", "epp-2"):
            elector = LeaderElector(
                coordination,
                LEASE,
                "default",
                identity,
                FAST_LEASE,
                clock=time.clock,
                sleep=time.sleep,
            )
            pairs.append((elector, asyncio.create_task(elector.run())))
        yield Electors(pairs, time)
        for _, task in pairs:
            await stop(task)


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def at_most_one_leader(electors: Electors) -> Callable[[], None]:
    def check() -> None:
        assert len(electors.leaders()) <= 1

    return check


async def test_exactly_one_candidate_leads_and_holds_the_lease(kube, electors):
    await electors.one_leader()
    await electors.time.run_until(
        lambda: electors.time.now >= 5 * FAST_LEASE.lease_duration,
        within=6 * FAST_LEASE.lease_duration,
        between_steps=at_most_one_leader(electors),
    )
    [leader] = electors.leaders()
    lease = kube.get("coordination.k8s.io/v1", "Lease", LEASE)
    assert lease["spec"]["holderIdentity"] == leader.identity
    assert LEASE == "epp-default-pool-a.gateway-api-inference-extension.sigs.k8s.io"


async def test_a_released_lease_is_taken_over_before_it_would_expire(kube, electors):
    leader = await electors.one_leader()
    await stop(electors.task_of(leader))
    await leader.release()
    took = await electors.time.run_until(
        lambda: len(electors.leaders()) == 1, within=FAST_LEASE.lease_duration
    )
    assert not leader.is_leader
    assert took <= FAST_LEASE.retry_period


async def test_a_leader_that_steps_down_hands_the_lease_on_and_never_takes_it_back(kube, electors):
    leader = await electors.one_leader()
    [successor] = [elector for elector, _ in electors.pairs if elector is not leader]
    await leader.step_down()  # its run goes on, reading the Lease
    took = await electors.time.run_until(
        lambda: successor.is_leader, within=FAST_LEASE.lease_duration
    )
    assert took <= FAST_LEASE.retry_period
    await stop(electors.task_of(successor))  # the Lease expires: free for anyone
    await electors.time.run_until(
        lambda: electors.time.now >= took + 3 * FAST_LEASE.lease_duration,
        within=4 * FAST_LEASE.lease_duration,
    )
    assert not leader.is_leader
    assert leader.holder == successor.identity  # still read: who holds it is known


async def test_a_vanished_leader_is_replaced_once_the_lease_expires(kube, electors):
    leader = await electors.one_leader()
    await stop(electors.task_of(leader))
    [successor] = [elector for elector, _ in electors.pairs if elector is not leader]
    took = await electors.time.run_until(
        lambda: successor.is_leader, within=3 * FAST_LEASE.lease_duration
    )
    # Expiry counts from when the successor saw the last renewal: at most a
    # retry before the stop, or a retry after it; then a retry to notice.
    assert FAST_LEASE.lease_duration - FAST_LEASE.retry_period <= took
    assert took <= FAST_LEASE.lease_duration + 2 * FAST_LEASE.retry_period
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


async def test_a_leader_that_cannot_renew_steps_down_at_its_renew_deadline(kube, electors):
    await electors.one_leader()
    kube.fail("/leases")
    took = await electors.time.run_until(
        lambda: not electors.leaders(), within=3 * FAST_LEASE.renew_deadline
    )
    assert FAST_LEASE.renew_deadline - FAST_LEASE.retry_period <= took
    assert took <= FAST_LEASE.renew_deadline + FAST_LEASE.retry_period
    kube.heal()
    await electors.one_leader()
