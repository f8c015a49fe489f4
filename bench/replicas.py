"""Replicas of one pool (docs/operations/replicas.md), on loopback through
real Envoys: what forwarding a decision costs, and what a decider kill -9
and a cut link do to the traffic.

    python3 -m bench.replicas [--requests 300] [--json]

- forwarding: sequential requests, alternately through the decider's Envoy
  (decided in process) and a forwarding replica's Envoy (decided over the
  gRPC stream); each request's latency at the client, p50 and p90.
- kill: 8 clients through the two forwarding replicas; the decider gets
  SIGKILL after 1 s. Non-200 answers, the longest time without a completed
  request around the kill, the slowest request.
- partition: the replica behind the relay is cut for 1.5 s; non-200
  answers, and how long after the cut ends it logs that it rejoined.

The model servers answer at once (no hold) for the forwarding run, so the
figure is the EPP path; 50 ms per request in the other two.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.support.replicas import complete, replicated_pool

CLIENTS = 8


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(session: aiohttp.ClientSession, url: str, prompt: str, hold_s: float):
    start = time.monotonic()
    status = await complete(session, url, prompt, "chat", hold_s)
    return status, start, time.monotonic()


async def forwarding(requests: int) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        async with replicated_pool(Path(workdir)) as (pool, _), aiohttp.ClientSession() as session:
            for n in range(20):  # warm both paths
                await timed(session, pool.urls[n % 2], f"warm {n}", 0.0)
            local: list[float] = []
            forwarded: list[float] = []
            for n in range(requests):
                for url, into in ((pool.urls[0], local), (pool.urls[1], forwarded)):
                    status, start, end = await timed(session, url, f"r{n}", 0.0)
                    assert status == 200, status
                    into.append((end - start) * 1000)
    return {
        "requests_each": requests,
        "decided_here_ms": {"p50": quantile(local, 0.5), "p90": quantile(local, 0.9)},
        "forwarded_ms": {"p50": quantile(forwarded, 0.5), "p90": quantile(forwarded, 0.9)},
        "p50_ratio": quantile(forwarded, 0.5) / quantile(local, 0.5),
    }


async def under_load(
    session: aiohttp.ClientSession, urls: list[str], seconds: float, out: list
) -> None:
    deadline = time.monotonic() + seconds

    async def client(n: int) -> None:
        k = 0
        while time.monotonic() < deadline:
            out.append(await timed(session, urls[n % len(urls)], f"c{n}.{k}", 0.05))
            k += 1

    await asyncio.gather(*(client(n) for n in range(CLIENTS)))


def longest_gap(results: list, since: float, until: float) -> float:
    ends = sorted(end for _, _, end in results if since <= end <= until)
    points = [since, *ends, until]
    return max(b - a for a, b in itertools.pairwise(points))


async def kill() -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        async with replicated_pool(Path(workdir)) as (pool, _), aiohttp.ClientSession() as session:
            results: list = []
            load = asyncio.ensure_future(under_load(session, pool.urls[1:], 4.0, results))
            await asyncio.sleep(1.0)
            killed = time.monotonic()
            pool.decider.process.send_signal(signal.SIGKILL)
            await load
            peaks = pool.peaks()
    return {
        "requests": len(results),
        "not_200": sum(1 for status, _, _ in results if status != 200),
        "longest_gap_ms": longest_gap(results, killed - 0.5, killed + 2.0) * 1000,
        "slowest_ms": max(end - start for _, start, end in results) * 1000,
        "median_ms": statistics.median(end - start for _, start, end in results) * 1000,
        "peak_per_endpoint": peaks,
    }


async def partition() -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        async with (
            replicated_pool(Path(workdir), cut=True) as (pool, relay),
            aiohttp.ClientSession() as session,
        ):
            cut_off = pool.replicas[1]
            results: list = []
            load = asyncio.ensure_future(under_load(session, pool.urls, 4.0, results))
            await asyncio.sleep(1.0)
            relay.sever()
            await asyncio.sleep(1.5)
            joins = cut_off.log().count("rejoined the decider")
            relay.mend()
            mended = time.monotonic()
            while cut_off.log().count("rejoined the decider") == joins:
                await asyncio.sleep(0.005)
            rejoined = time.monotonic() - mended
            await load
            peaks = pool.peaks()
    return {
        "requests": len(results),
        "not_200": sum(1 for status, _, _ in results if status != 200),
        "rejoined_after_ms": rejoined * 1000,
        "peak_per_endpoint": peaks,
    }


async def run(requests: int) -> dict:
    return {
        "forwarding": await forwarding(requests),
        "kill": await kill(),
        "partition": await partition(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.replicas", description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.requests))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    fwd = report["forwarding"]
    print(
        f"forwarding ({fwd['requests_each']} each): decided here p50 "
        f"{fwd['decided_here_ms']['p50']:.2f} ms p90 {fwd['decided_here_ms']['p90']:.2f} ms; "
        f"forwarded p50 {fwd['forwarded_ms']['p50']:.2f} ms p90 "
        f"{fwd['forwarded_ms']['p90']:.2f} ms; ratio {fwd['p50_ratio']:.2f}"
    )
    k = report["kill"]
    print(
        f"kill -9: {k['requests']} requests, {k['not_200']} not 200, longest gap "
        f"{k['longest_gap_ms']:.0f} ms, slowest {k['slowest_ms']:.0f} ms "
        f"(median {k['median_ms']:.0f} ms), peaks {k['peak_per_endpoint']}"
    )
    p = report["partition"]
    print(
        f"partition: {p['requests']} requests, {p['not_200']} not 200, rejoined "
        f"{p['rejoined_after_ms']:.0f} ms after the cut ended, peaks {p['peak_per_endpoint']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
