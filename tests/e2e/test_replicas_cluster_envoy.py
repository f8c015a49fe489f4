"""Three EPP replicas of one pool in cluster mode (leader election on a
2 s Lease, against the emulated API server), each behind its own Envoy, in
front of two stand-in model servers with a limit of 3 per endpoint. The
Lease holder decides for all three. Killed with SIGKILL it releases
nothing: the survivors run degraded within their shares, one of them takes
the Lease once it expires and decides with a newer epoch, rebuilt from
what the survivors report, and no endpoint runs more than its limit."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.support.epp_process import RunningEpp
from tests.support.kube import KubeEmulator
from tests.support.replicas import (
    LEASE_S,
    LIMIT,
    clustered_pool,
    complete,
    gauge,
    lease_holder,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.envoy


def after(epps: list[RunningEpp], line: str, before: list[int]) -> bool:
    """Whether each of `epps` logged `line` more often than `before`."""
    return all(e.log().count(line) > n for e, n in zip(epps, before, strict=True))


async def test_a_killed_lease_holder_is_replaced_within_the_lease_and_nothing_overshoots(
    tmp_path: Path,
) -> None:
    async with (
        KubeEmulator() as kube,
        clustered_pool(tmp_path, kube) as pool,
        aiohttp.ClientSession() as session,
    ):
        ends: list[tuple[int, float]] = []
        deadline = time.monotonic() + 6.0

        async def client(n: int) -> None:
            k = 0
            while time.monotonic() < deadline:
                url = pool.urls[1 + n % 2]
                ends.append(
                    (await complete(session, url, f"c{n}.{k}", "chat", 0.05), time.monotonic())
                )
                k += 1

        load = asyncio.gather(*(client(n) for n in range(8)))
        await asyncio.sleep(1.0)
        assert await gauge(session, pool.decider, "epp_decider_epoch") == 0
        survivors = pool.replicas
        degraded = [r.log().count("runs degraded") for r in survivors]
        rejoined = [r.log().count("rejoined the decider") for r in survivors]
        pool.decider.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await pool.decider.process.wait()
        await eventually(lambda: after(survivors, "runs degraded", degraded), 3.0)
        await eventually(lambda: after(survivors, "rejoined the decider", rejoined), 6.0)
        resumed_after = time.monotonic() - killed
        holder = next(
            r
            for r, name in zip(survivors, ("epp-b", "epp-c"), strict=True)
            if lease_holder(kube) == name
        )
        assert await gauge(session, holder, "epp_decider_epoch") == 1
        for replica in survivors:
            assert await gauge(session, replica, "epp_replica_degraded") == 0
        await load
    lease_duration = LEASE_S[0]
    assert resumed_after < lease_duration + 1.0, resumed_after
    gap = [at for status, at in ends if killed + 1.0 < at < killed + lease_duration]
    assert gap, "admission stopped while no decider answered"
    assert [status for status, _ in ends] == [200] * len(ends)
    assert max(pool.peaks()) <= LIMIT, pool.peaks()
