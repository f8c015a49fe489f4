"""Three EPP replicas of one pool on loopback, each behind its own Envoy:
one decides (`--decider-port`), two forward to it (`--decider`), in front
of two stand-in model servers with a per-endpoint limit of 3
(`maxPerEndpoint`), so each replica's share is 1. Every request of every
replica is decided by the decider's one core: strict priority holds across
replicas and no endpoint runs more than its limit; a killed decider or a
cut link costs no stream on the survivors, which admit within their share
meanwhile and rejoin when the decider answers again."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.support.replicas import (
    LIMIT,
    Pool,
    complete,
    gauge,
    replicated_pool,
    start_decider,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.envoy


def started(pool: Pool) -> list[str]:
    """Prompts in the order the model servers began them."""
    return [r["prompt"] for r in sorted(
        (r for s in pool.servers for r in s.received), key=lambda r: r["at"]
    )]  # fmt: skip


@pytest.mark.parametrize("args", [(), ("--workers=2",)], ids=["one-process", "workers"])
async def test_replicas_serve_higher_bands_first_and_keep_every_endpoint_within_its_limit(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # With workers, each replica's core owner forwards its workers' requests
    # (the decider's own decides them), and the decisions come back through it.
    async with (
        replicated_pool(tmp_path, args=args) as (pool, _),
        aiohttp.ClientSession() as session,
    ):
        # 6 batch requests fill both endpoints (2 x 3), 6 more wait at the
        # decider; they end 0.15 s apart, so each freed place is one decision
        batch = [
            asyncio.ensure_future(
                complete(session, pool.urls[n % 3], f"batch {n}", "batch", 0.5 + 0.15 * n)
            )
            for n in range(12)
        ]
        await pool.decider.wait_queued(session, 6)
        chat = [
            asyncio.ensure_future(complete(session, pool.urls[n % 3], f"chat {n}", "chat", 2.0))
            for n in range(3)
        ]
        await pool.decider.wait_queued(session, 9)
        statuses = await asyncio.gather(*batch, *chat)
    assert statuses == [200] * 15
    order = [prompt.split()[0] for prompt in started(pool)]
    assert order[6:9] == ["chat"] * 3, " ".join(started(pool))
    assert max(pool.peaks()) <= LIMIT, pool.peaks()


async def steady_load(
    session: aiohttp.ClientSession, urls: list[str], seconds: float, results: list[int]
) -> None:
    """Clients sending back to back through `urls` for `seconds`."""
    deadline = time.monotonic() + seconds

    async def client(n: int) -> None:
        k = 0
        while time.monotonic() < deadline:
            results.append(await complete(session, urls[n % len(urls)], f"c{n}.{k}", "chat", 0.05))
            k += 1

    await asyncio.gather(*(client(n) for n in range(8)))


async def test_killing_the_decider_loses_no_stream_on_the_surviving_replicas(
    tmp_path: Path,
) -> None:
    async with replicated_pool(tmp_path) as (pool, _), aiohttp.ClientSession() as session:
        results: list[int] = []
        load = asyncio.ensure_future(steady_load(session, pool.urls[1:], 4.0, results))
        await asyncio.sleep(1.0)
        before = len(results)
        pool.decider.process.send_signal(signal.SIGKILL)
        await pool.decider.process.wait()
        await eventually(lambda: all("runs degraded" in r.log() for r in pool.replicas), 3.0)
        during = len(results)
        await asyncio.sleep(1.0)
        assert len(results) > during, "admission stopped while no decider answered"
        port = pool.decider.ports["decider"]
        pool.later.append(await start_decider(pool.workdir, pool.endpoints, port))
        await eventually(lambda: all("rejoined the decider" in r.log() for r in pool.replicas), 3.0)
        await load
    assert before > 0
    assert results == [200] * len(results)
    assert max(pool.peaks()) <= LIMIT, pool.peaks()


async def test_a_partitioned_replica_serves_within_its_share_and_rejoins(
    tmp_path: Path,
) -> None:
    async with (
        replicated_pool(tmp_path, cut=True) as (pool, relay),
        aiohttp.ClientSession() as session,
    ):
        cut_off = pool.replicas[1]
        results: list[int] = []
        load = asyncio.ensure_future(steady_load(session, pool.urls, 4.0, results))
        await asyncio.sleep(0.8)
        relay.sever()
        await eventually(lambda: "runs degraded" in cut_off.log(), 3.0)
        assert await gauge(session, cut_off, "epp_replica_degraded") == 1
        served = await gauge(session, cut_off, "epp_replica_degraded_admissions_total")
        await asyncio.sleep(1.0)
        relay.mend()
        mended = time.monotonic()
        await eventually(lambda: "rejoined the decider" in cut_off.log(), 3.0)
        rejoined_after = time.monotonic() - mended
        assert await gauge(session, cut_off, "epp_replica_degraded") == 0
        assert await gauge(session, cut_off, "epp_replica_degraded_admissions_total") > served
        await load
    assert results == [200] * len(results)
    assert max(pool.peaks()) <= LIMIT, pool.peaks()
    assert rejoined_after < 1.0, rejoined_after


async def test_a_draining_decider_hands_its_replicas_to_degraded_mode_not_its_503s(
    tmp_path: Path,
) -> None:
    async with (
        replicated_pool(tmp_path, decider_args=("--drain-timeout=2s",)) as (pool, _),
        aiohttp.ClientSession() as session,
    ):
        results: list[int] = []
        load = asyncio.ensure_future(steady_load(session, pool.urls[1:], 4.0, results))
        await asyncio.sleep(1.0)
        pool.decider.process.send_signal(signal.SIGTERM)
        await eventually(lambda: all("runs degraded" in r.log() for r in pool.replicas), 3.0)
        await load
    assert results and results == [200] * len(results)
    assert max(pool.peaks()) <= LIMIT, pool.peaks()
