"""Replicas in cluster mode (`--decider-port` with leader election) against
the emulated API server: the Lease holder decides for every replica, which
find it through the Lease; when the Lease moves, the new holder decides
with a newer epoch, rebuilds what runs from the replicas' reports, and
keeps the share of a replica that has not reported aside."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.request import InferenceRequest
from epp.serve.server import EppServer
from tests.support.kube import KubeEmulator, pod, pool
from tests.support.serving import loopback_options
from tests.support.waiting import eventually


def request() -> FlowRequest:
    payload = InferenceRequest("m", "m", prompt="hello")
    return FlowRequest("r1", "tenant", 0, 0.0, payload=payload)


def cluster_options(kube: KubeEmulator, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A pool of one pod, and the options two replicas in cluster mode share."""
    kube.apply(pool())
    kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}))
    return {
        "pool_name": "pool-a",
        "kubeconfig": kube.write_kubeconfig(tmp_path / "kubeconfig"),
        "ha_enable_leader_election": True,
        "decider_port": 0,
        "replicas": 2,
        **overrides,
    }


async def test_the_lease_holder_decides_for_every_replica_and_its_successor_takes_over(
    tmp_path,
) -> None:
    async with KubeEmulator() as kube:
        common = cluster_options(kube, tmp_path)
        first = EppServer(loopback_options(**common, replica_id="first"))
        await first.start()
        second: EppServer | None = None
        try:
            assert first._mode is not None and first.replica is not None
            await eventually(lambda: first._mode.is_leader, 10)
            second = EppServer(loopback_options(**common, replica_id="second"))
            await second.start()
            assert second.replica is not None
            await eventually(lambda: first.replica.joined and second.replica.joined, 10)
            assert second.replica.decider == f"127.0.0.1:{first.ports['decider']}"
            epoch = second.replica.epoch

            running = request()
            assert second.replica.offer(running) is None
            assert await asyncio.wait_for(second.replica.wait(running), 5) is Outcome.DISPATCHED
            assert running.endpoint == "10.0.0.1:8000"
            assert first.core.in_flight == 1 and second.core.in_flight == 0

            await first.stop()  # releases the Lease
            await eventually(lambda: second._mode is not None and second._mode.is_leader, 10)
            await eventually(lambda: second.replica.joined and second.replica.epoch > epoch, 10)
            assert second.replica.decider == f"127.0.0.1:{second.ports['decider']}"
            decider = second.decider
            assert decider is not None
            await eventually(lambda: decider.has_reported("second"))
            # the running request adopted, and the first replica's share kept
            # aside: it has not reported to the new holder
            kept = second.core.in_flight - 1
            assert kept >= 1
            second.replica.complete(running)
            await eventually(lambda: second.core.in_flight == kept)
        finally:
            if first._mode is not None and first.replica is not None and not first.replica._closing:
                await first.stop()
            if second is not None:
                await second.stop()


async def test_a_draining_holder_hands_the_lease_on_at_once_not_a_lease_duration_later(
    tmp_path,
) -> None:
    async with KubeEmulator() as kube:
        common = cluster_options(
            kube, tmp_path, ha_lease_duration=15.0, ha_renew_deadline=10.0, ha_retry_period=0.2
        )
        first = EppServer(loopback_options(**common, replica_id="first", drain_timeout=30.0))
        await first.start()
        second: EppServer | None = None
        stopping: asyncio.Task[None] | None = None
        try:
            assert first._mode is not None and first._mode.elector is not None
            await eventually(lambda: first._mode.is_leader, 10)
            second = EppServer(loopback_options(**common, replica_id="second"))
            await second.start()
            assert second._mode is not None and second.replica is not None
            await eventually(lambda: second.replica.joined, 10)
            epoch = second.replica.epoch

            stopping = asyncio.create_task(first.stop())  # a 30 s drain window
            started = asyncio.get_running_loop().time()
            await eventually(lambda: second._mode.is_leader, 5)
            assert asyncio.get_running_loop().time() - started < 5  # the lease lasts 15 s
            await eventually(lambda: second.replica.joined and second.replica.epoch > epoch, 5)
            assert not stopping.done()  # the old holder still drains
            # it reads on without competing: it never takes the Lease back
            await asyncio.sleep(1.0)
            assert not first._mode.elector.is_leader and second._mode.is_leader
        finally:
            if stopping is not None:
                first.hurry()
                await stopping
            elif first.replica is not None and not first.replica._closing:
                await first.stop()
            if second is not None:
                await second.stop()
