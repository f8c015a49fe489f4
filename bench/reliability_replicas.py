"""Replicas of one pool under faults, through real Envoys: `bench.reliability`'s
replica cases (docs/operations/replicas.md).

Three replicas on loopback (`tests.support.replicas`): a decider and two
forwarding replicas, each behind its own Envoy, in front of two stand-in
model servers with a limit of 3 requests each, so a replica's degraded share
is 1. `CLIENTS` closed-loop clients send requests held 50 ms. A request is
answered when its status arrives (a stream cut after it still counts), lost
when none does.

- `decider_kill`: load through the two forwarding replicas; the decider gets
  SIGKILL, and is started again on its port `down_s` later. Must be: 0 lost,
  0 non-200 on the survivors, both rejoined, no endpoint above its limit.
- `replica_partition`: load through all three; the link of one replica to
  the decider is cut for `cut_s`. Must be: 0 lost, 0 non-200, rejoined
  within 1 s of the cut ending, no endpoint above its limit.
- `rolling_restart`: load through all three; each replica, then the decider,
  gets SIGTERM (a 1 s drain) and is started again on its ports, the next
  one once the restarted one has joined. Its own Envoy fails closed while it
  is down (5xx, answered); the other replicas' requests must all be 200;
  0 lost; no endpoint above its limit.

In cluster mode (`tests.support.replicas.clustered_pool`: three replicas
against the emulated API server, a Lease of 2 s, `LEASE_S`), where the
Lease holder decides and every replica forwards to it:

- `decider_kill_cluster`: load through the two replicas that do not hold
  the Lease; the holder gets SIGKILL and is started again `down_s` later,
  as a pod restarts. Must be: 0 lost, 0 non-200, a new holder deciding and
  both survivors rejoined within the lease duration plus 1 s, no endpoint
  above its limit.
- `rolling_restart_cluster`: load through all three; each replica, the
  holder last, gets SIGTERM (a 1 s drain; the holder releases the Lease at
  its start) and is started again on its ext_proc port. As
  `rolling_restart`: the other replicas' requests must all be 200.

A partition is not among them: a replica reaches its decider at the
address the Lease names, so a relay cannot be put on one replica's path;
the link itself is the file mode's (`replica_partition`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.reliability import CaseResult
from tests.support.epp_process import RunningEpp, start_epp
from tests.support.kube import KubeEmulator
from tests.support.replicas import (
    LEASE_S,
    LIMIT,
    Pool,
    cluster_replica_args,
    clustered_pool,
    replicated_pool,
    start_decider,
    start_replica,
    transitions,
)

CLIENTS = 8
HOLD_S = 0.05
DRAIN = "--drain-timeout=1s"


@dataclass(slots=True)
class Sent:
    via: int
    """Index of the Envoy it went through (0: the decider's)."""
    start: float
    end: float = 0.0
    status: int | None = None
    """None: no answer at all (lost)."""


async def send(session: aiohttp.ClientSession, url: str, via: int, prompt: str, out: list) -> None:
    sent = Sent(via, time.monotonic())
    out.append(sent)
    body = {"model": "m", "prompt": prompt, "max_tokens": 2, "hold_s": HOLD_S}
    headers = {"x-llm-d-inference-objective": "chat"}
    try:
        async with session.post(url, data=json.dumps(body), headers=headers) as response:
            sent.status = response.status
            await response.read()
    except (aiohttp.ClientError, TimeoutError):
        pass
    sent.end = time.monotonic()


async def load(
    pool: Pool,
    via: list[int],
    out: list[Sent],
    seconds: float = 0.0,
    stop: asyncio.Event | None = None,
) -> None:
    """Closed-loop clients through the Envoys `via` for `seconds`, or until `stop` is set."""
    deadline = time.monotonic() + seconds

    def done() -> bool:
        return stop.is_set() if stop is not None else time.monotonic() >= deadline

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def client(n: int) -> None:
            for k in itertools.count():
                if done():
                    return
                index = via[(n + k) % len(via)]
                await send(session, pool.urls[index], index, f"c{n}.{k}", out)

        await asyncio.gather(*(client(n) for n in range(CLIENTS)))


def tally(result: CaseResult, sent: list[Sent], survivors: list[RunningEpp]) -> None:
    result.sent = len(sent)
    result.answered = sum(1 for s in sent if s.status is not None)
    result.lost = result.sent - result.answered
    result.epp_crashes = sum(1 for epp in survivors if epp.process.returncode is not None)


def longest_gap(sent: list[Sent], since: float, until: float) -> float:
    ends = sorted(s.end for s in sent if s.status == 200 and since <= s.end <= until)
    return max(b - a for a, b in itertools.pairwise([since, *ends, until]))


async def until_logged(epp: RunningEpp, line: str, before: int, timeout: float) -> float | None:
    """Seconds until `epp` logged `line` more than `before` times (None: not within `timeout`)."""
    start = time.monotonic()
    while epp.log().count(line) <= before:
        if time.monotonic() - start > timeout:
            return None
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def decider_kill(workdir: Path, seconds: float = 6.0, down_s: float = 2.0) -> CaseResult:
    result = CaseResult("decider_kill")
    started = time.monotonic()
    async with replicated_pool(workdir) as (pool, _):
        sent: list[Sent] = []
        traffic = asyncio.ensure_future(load(pool, [1, 2], sent, seconds))
        await asyncio.sleep(1.5)
        rejoins = [r.log().count("rejoined the decider") for r in pool.replicas]
        killed = time.monotonic()
        pool.decider.process.send_signal(signal.SIGKILL)
        await pool.decider.process.wait()
        await asyncio.sleep(down_s)
        port = pool.decider.ports["decider"]
        pool.later.append(await start_decider(pool.workdir, pool.endpoints, port))
        rejoined = [
            await until_logged(r, "rejoined the decider", n, 5.0)
            for r, n in zip(pool.replicas, rejoins, strict=True)
        ]
        await traffic
        tally(result, sent, pool.replicas)
        result.details.update(
            not_200=sum(1 for s in sent if s.status not in (None, 200)),
            longest_gap_ms=round(longest_gap(sent, killed - 0.5, killed + down_s) * 1000),
            rejoined=all(r is not None for r in rejoined),
            peak_per_endpoint=pool.peaks(),
            limit=LIMIT,
        )
    result.wall_s = time.monotonic() - started
    return result


async def replica_partition(workdir: Path, seconds: float = 5.0, cut_s: float = 1.5) -> CaseResult:
    result = CaseResult("replica_partition")
    started = time.monotonic()
    async with replicated_pool(workdir, cut=True) as (pool, relay):
        cut_off = pool.replicas[1]
        sent: list[Sent] = []
        traffic = asyncio.ensure_future(load(pool, [0, 1, 2], sent, seconds))
        await asyncio.sleep(1.0)
        rejoins = cut_off.log().count("rejoined the decider")
        relay.sever()
        await asyncio.sleep(cut_s)
        relay.mend()
        rejoined_after = await until_logged(cut_off, "rejoined the decider", rejoins, 5.0)
        await traffic
        tally(result, sent, [pool.decider, *pool.replicas])
        result.details.update(
            not_200=sum(1 for s in sent if s.status not in (None, 200)),
            served_through_cut_off=sum(1 for s in sent if s.via == 2 and s.status == 200),
            rejoined_after_ms=None if rejoined_after is None else round(rejoined_after * 1000),
            peak_per_endpoint=pool.peaks(),
            limit=LIMIT,
        )
    result.wall_s = time.monotonic() - started
    return result


async def restart(pool: Pool, index: int) -> RunningEpp:
    """EPP `index` (0: the decider) stopped with SIGTERM and started again on its ports."""
    old = pool.decider if index == 0 else pool.replicas[index - 1]
    decider_port = pool.decider.ports["decider"]
    await old.terminate()
    again = (f"--grpc-port={old.ports['grpc']}", DRAIN)
    if index == 0:
        fresh = await start_decider(pool.workdir, pool.endpoints, decider_port, *again)
        pool.decider = fresh
    else:
        fresh = await start_replica(pool.workdir, pool.endpoints, decider_port, index, *again)
        pool.replicas[index - 1] = fresh
    pool.later.append(fresh)
    return fresh


async def rolling_restart(workdir: Path, settle_s: float = 1.0) -> CaseResult:
    result = CaseResult("rolling_restart")
    started = time.monotonic()
    async with replicated_pool(workdir, args=(DRAIN,)) as (pool, _):
        await rolling(
            result,
            pool,
            lambda index: restart(pool, index),
            lambda: pool.replicas,  # the decider joins none
            settle_s,
        )
    result.wall_s = time.monotonic() - started
    return result


async def rolling(
    result: CaseResult,
    pool: Pool,
    restart_one: Callable[[int], Awaitable[RunningEpp]],
    joining: Callable[[], list[RunningEpp]],
    settle_s: float,
) -> None:
    """Load through all three; EPP 1, 2, then 0 restarted by `restart_one`,
    the next once the restarted one (after 0: every one of `joining`) has
    joined the decider."""
    sent: list[Sent] = []
    stop = asyncio.Event()
    traffic = asyncio.ensure_future(load(pool, [0, 1, 2], sent, stop=stop))
    windows: list[tuple[int, float, float]] = []
    await asyncio.sleep(settle_s)
    for index in (1, 2, 0):
        begin = time.monotonic()
        joins = {id(epp): epp.log().count("joined the decider") for epp in joining()}
        fresh = await restart_one(index)
        for epp in joining() if index == 0 else [fresh]:
            await until_logged(epp, "joined the decider", joins.get(id(epp), 0), 10.0)
        windows.append((index, begin, time.monotonic()))
        await asyncio.sleep(settle_s)
    stop.set()
    await traffic
    tally(result, sent, [pool.decider, *pool.replicas])
    restarting_statuses(result, sent, windows)
    result.details.update(peak_per_endpoint=pool.peaks(), limit=LIMIT)


def restarting_statuses(
    result: CaseResult, sent: list[Sent], windows: list[tuple[int, float, float]]
) -> None:
    """The statuses through each EPP's Envoy while it restarted (`windows`:
    its index, from, to) and elsewhere, and how long each restart took."""

    def restarting(s: Sent) -> bool:
        return any(s.via == i and b <= s.end and s.start <= e for i, b, e in windows)

    result.details.update(
        not_200_through_the_restarting=sum(1 for s in sent if restarting(s) and s.status != 200),
        not_200_elsewhere=sum(1 for s in sent if not restarting(s) and s.status != 200),
        statuses=dict(Counter(s.status for s in sent)),
        restart_s=[round(e - b, 2) for _, b, e in windows],
    )


CLUSTER_NAMES = ("epp-a", "epp-b", "epp-c")
"""The cluster-mode replicas' names, the first the Lease holder at the start."""


async def start_cluster_replica(
    pool: Pool, kube: KubeEmulator, name: str, *args: str
) -> RunningEpp:
    flags, env = cluster_replica_args(pool.workdir, kube, name)
    return await start_epp(*flags, *args, env=env)


async def decider_kill_cluster(
    workdir: Path, seconds: float = 7.0, down_s: float = 2.0
) -> CaseResult:
    result = CaseResult("decider_kill_cluster")
    started = time.monotonic()
    async with KubeEmulator() as kube, clustered_pool(workdir, kube) as pool:
        sent: list[Sent] = []
        traffic = asyncio.ensure_future(load(pool, [1, 2], sent, seconds))
        await asyncio.sleep(1.5)
        joins = [r.log().count("joined the decider") for r in pool.replicas]
        held = transitions(kube)
        killed = time.monotonic()
        pool.decider.process.send_signal(signal.SIGKILL)
        await pool.decider.process.wait()

        async def restarted() -> None:
            await asyncio.sleep(down_s)  # a pod's restart, while the others take over
            pool.later.append(await start_cluster_replica(pool, kube, CLUSTER_NAMES[0]))

        restart = asyncio.ensure_future(restarted())
        while transitions(kube) == held and time.monotonic() - killed < 30.0:
            await asyncio.sleep(0.01)
        new_holder_s = time.monotonic() - killed
        rejoined = [
            await until_logged(r, "joined the decider", n, 10.0)
            for r, n in zip(pool.replicas, joins, strict=True)
        ]
        rejoined_s = time.monotonic() - killed
        await restart
        await traffic
        tally(result, sent, pool.replicas)
        result.details.update(
            not_200=sum(1 for s in sent if s.status not in (None, 200)),
            longest_gap_ms=round(longest_gap(sent, killed - 0.5, killed + LEASE_S[0]) * 1000),
            new_holder_after_s=round(new_holder_s, 2),
            rejoined_after_s=round(rejoined_s, 2) if all(r is not None for r in rejoined) else None,
            lease_s=LEASE_S[0],
            peak_per_endpoint=pool.peaks(),
            limit=LIMIT,
        )
    result.wall_s = time.monotonic() - started
    return result


async def rolling_restart_cluster(workdir: Path, settle_s: float = 1.0) -> CaseResult:
    result = CaseResult("rolling_restart_cluster")
    started = time.monotonic()
    async with KubeEmulator() as kube, clustered_pool(workdir, kube) as pool:

        async def restart_one(index: int) -> RunningEpp:
            old = pool.decider if index == 0 else pool.replicas[index - 1]
            await old.terminate()
            fresh = await start_cluster_replica(
                pool, kube, CLUSTER_NAMES[index], f"--grpc-port={old.ports['grpc']}", DRAIN
            )
            if index == 0:
                pool.decider = fresh  # the first started, not the holder any more
            else:
                pool.replicas[index - 1] = fresh
            pool.later.append(fresh)
            return fresh

        await rolling(result, pool, restart_one, lambda: [pool.decider, *pool.replicas], settle_s)
    result.wall_s = time.monotonic() - started
    return result
