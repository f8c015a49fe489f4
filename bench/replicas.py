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
- fairness (`--fairness-s`, `--fairness-policy`): the tenants of config/scenarios/unequal-tenants
  (prompt and output tokens as it gives them, each tenant backlogged by
  `TENANT_CLIENTS` closed-loop clients, the answer held 0.2 ms per prompt
  and 2 ms per output token), plus a light stream of the higher `chat`
  band; once all through the decider's Envoy (one process decides its own
  requests), once spread over the three replicas' Envoys. From the merged
  records (the decider's decision log at debug, each model server's start
  and end of each request): priority inversions (a request decided while
  one of a higher band, already received at the decider, waited there),
  each endpoint's peak against its limit, and the VTC gap: the largest
  difference in weighted token service (1 x prompt tokens when a request
  starts at its server, 2 x output tokens when it ends) between tenants
  over runs of 20 ms samples with the same tenants backlogged (sent, not
  started), as `epp.sim.report.band_fairness` measures it, against the
  single-process bound (2 x the largest single-request charge).
- fairness-kill: the same tenants through the two forwarding replicas'
  Envoys, the decider killed (SIGKILL) halfway and started again on its
  port `KILL_DOWN_S` later: the VTC gap over the whole run, before the
  kill, and from the new decider's start on (its fairness counters start
  afresh: docs/operations/replicas.md).

The model servers answer at once (no hold) for the forwarding run, so the
figure is the EPP path; 50 ms per request in the other two.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import signal
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from epp.sim.scenario_file import load_scenario
from tests.support.replicas import (
    LIMIT,
    complete,
    config_with_fairness,
    replicated_pool,
    start_decider,
)

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


TENANT_CLIENTS = 8
KILL_DOWN_S = 0.5
SAMPLE_S = 0.02
DECISIONS = "epp.serve.decider.decisions"
UNEQUAL_TENANTS = Path(__file__).parent.parent / "config/scenarios/unequal-tenants.yaml"


def tenant_sizes() -> dict[str, tuple[int, int]]:
    """Each unequal-tenants tenant's (prompt, output) tokens."""
    scenario = load_scenario(UNEQUAL_TENANTS)
    return {t.name: (int(t.prompt_tokens.a), int(t.output_tokens.a)) for t in scenario.tenants}


async def fair_request(
    session: aiohttp.ClientSession, url: str, name: str, objective: str, tenant: str,
    sizes: tuple[int, int], sent: list,
) -> int:  # fmt: skip
    prompt_tokens, output_tokens = sizes
    body = {
        "model": "m",
        "prompt": name.ljust(4 * prompt_tokens, "x"),
        "max_tokens": output_tokens,
        "hold_s": 0.0002 * prompt_tokens + 0.002 * output_tokens,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens},
    }
    headers = {"x-llm-d-inference-objective": objective, "x-llm-d-inference-fairness-id": tenant}
    sent.append((name, tenant, time.monotonic()))
    async with session.post(url, data=json.dumps(body), headers=headers) as response:
        await response.read()
        return response.status


def decision_lines(log: str) -> list[tuple[str, int, float, float]]:
    """(request id, priority, received, decided) per dispatch in a decision log."""
    found = []
    for line in log.splitlines():
        if " decision " not in line or "outcome dispatched" not in line:
            continue
        words = line.split(" decision ", 1)[1].split()
        found.append((words[0], int(words[2]), float(words[4]), float(words[6])))
    return found


def inversions(decided: list[tuple[str, int, float, float]]) -> int:
    """Dispatches made while a request of a higher band waited at the decider."""
    count = 0
    for _, priority, _, at in decided:
        count += any(p > priority and received < at < done for _, p, received, done in decided)
    return count


def vtc_gap(
    records: list[dict],
    sent: list,
    sizes: dict[str, tuple[int, int]],
    since: float = -math.inf,
    until: float = math.inf,
) -> float:
    """The largest service difference over runs of samples with the same
    backlogged tenants (`epp.sim.report.band_fairness`), counting only the
    samples from `since` to `until` (a run begins again at `since`)."""
    tenants = sorted(sizes)
    started = {r["prompt"].rstrip("x"): r for r in records}
    events = []  # (time, tenant, service) and backlog (+1 sent, -1 started)
    backlog_events = []
    for name, tenant, at in sent:
        if tenant not in sizes or name not in started:
            continue
        record = started[name]
        prompt_tokens, output_tokens = sizes[tenant]
        events += [
            (record["at"], tenant, prompt_tokens),
            (record["ended"], tenant, 2 * output_tokens),
        ]
        backlog_events += [(at, tenant, 1), (record["at"], tenant, -1)]
    events.sort()
    backlog_events.sort()
    begin = min(at for at, _, _ in backlog_events)
    end = max(at for at, _, _ in events)
    service = dict.fromkeys(tenants, 0.0)
    waiting = dict.fromkeys(tenants, 0)
    e = b = 0
    current: tuple[str, ...] = ()
    start: dict[str, float] = {}
    gap = 0.0
    t = begin
    while t <= end:
        while e < len(events) and events[e][0] <= t:
            service[events[e][1]] += events[e][2]
            e += 1
        while b < len(backlog_events) and backlog_events[b][0] <= t:
            waiting[backlog_events[b][1]] += backlog_events[b][2]
            b += 1
        if t < since:
            t += SAMPLE_S
            continue
        if t > until:
            break
        backlogged = tuple(name for name in tenants if waiting[name] > 0)
        if backlogged != current or not start:
            current, start = backlogged, dict(service)
        if len(current) >= 2:
            received = [service[name] - start[name] for name in current]
            gap = max(gap, max(received) - min(received))
        t += SAMPLE_S
    return gap


async def fairness_run(
    seconds: float, spread: bool, policy: str, kill_at: float | None = None
) -> dict:
    """With `kill_at`: through the two forwarding replicas only, and the
    decider gets SIGKILL `kill_at` s in, started again on its port
    `KILL_DOWN_S` later; the gap is also given before the kill and from
    the new decider's start on."""
    sizes = tenant_sizes()
    with tempfile.TemporaryDirectory() as workdir:
        async with (
            replicated_pool(
                Path(workdir),
                decider_args=(f"--logger-levels={DECISIONS}=debug",),
                config=config_with_fairness(policy),
            ) as (pool, _),
            aiohttp.ClientSession() as session,
        ):  # fmt: skip
            urls = pool.urls if spread else pool.urls[:1]
            if kill_at is not None:
                urls = pool.urls[1:]
            sent: list = []
            statuses: list[int] = []
            began = time.monotonic()
            deadline = began + seconds
            times: dict[str, float] = {}

            async def tenant_client(tenant: str, n: int) -> None:
                k = 0
                while time.monotonic() < deadline:
                    url = urls[(n + k) % len(urls)]
                    name = f"{tenant}.{n}.{k}"
                    statuses.append(
                        await fair_request(
                            session, url, name, "standard", tenant, sizes[tenant], sent
                        )
                    )
                    k += 1

            async def chat_client() -> None:
                k = 0
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.25)
                    name = f"chat.{k}"
                    statuses.append(
                        await fair_request(
                            session, urls[k % len(urls)], name, "chat", "chat", (20, 5), sent
                        )
                    )
                    k += 1

            async def kill() -> None:
                if kill_at is None:
                    return
                await asyncio.sleep(kill_at)
                times["killed"] = time.monotonic()
                pool.decider.process.send_signal(signal.SIGKILL)
                await pool.decider.process.wait()
                await asyncio.sleep(KILL_DOWN_S)
                port = pool.decider.ports["decider"]
                fresh = await start_decider(
                    pool.workdir, pool.endpoints, port, f"--logger-levels={DECISIONS}=debug"
                )
                pool.later.append(fresh)
                times["restarted"] = time.monotonic()

            await asyncio.gather(
                chat_client(),
                kill(),
                *(tenant_client(t, n) for t in sizes for n in range(TENANT_CLIENTS)),
            )
            deciders = [pool.decider, *pool.later]
            decided = [line for epp in deciders for line in decision_lines(epp.log())]
            records = [r for server in pool.servers for r in server.received if "ended" in r]
            peaks = pool.peaks()
    largest = max(p + 2 * o for p, o in sizes.values())
    across = {}
    if kill_at is not None:
        across = {
            "killed_after_s": kill_at,
            "restarted_after_s": round(times["restarted"] - times["killed"], 2),
            "vtc_gap_before_kill": vtc_gap(records, sent, sizes, until=times["killed"]),
            "vtc_gap_from_restart": vtc_gap(records, sent, sizes, since=times["restarted"]),
        }
    return {
        **across,
        "replicas_used": len(urls),
        "requests": len(statuses),
        "not_200": sum(1 for status in statuses if status != 200),
        "decisions_logged": len(decided),
        "priority_inversions": inversions(decided),
        "peak_per_endpoint": peaks,
        "limit": LIMIT,
        "vtc_gap": vtc_gap(records, sent, sizes),
        "vtc_bound": 2 * largest,
    }


async def fairness(seconds: float, policy: str, kill: bool = False) -> dict:
    if kill:
        return {
            "policy": policy,
            "decider_kill": await fairness_run(seconds, True, policy, seconds / 2),
        }
    return {
        "policy": policy,
        "one_process": await fairness_run(seconds, False, policy),
        "three_replicas": await fairness_run(seconds, True, policy),
    }


async def run(requests: int, fairness_s: float, policy: str, only: str | None) -> dict:
    cases = {
        "forwarding": lambda: forwarding(requests),
        "kill": kill,
        "partition": partition,
        "fairness": lambda: fairness(fairness_s, policy),
        "fairness-kill": lambda: fairness(fairness_s, policy, kill=True),
    }
    return {name: await case() for name, case in cases.items() if only in (None, name)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.replicas", description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--fairness-s", type=float, default=20.0)
    parser.add_argument(
        "--fairness-policy",
        default="vtc-fairness-policy",
        choices=(
            "vtc-fairness-policy",
            "round-robin-fairness-policy",
            "global-strict-fairness-policy",
        ),
    )
    parser.add_argument(
        "--only", choices=("forwarding", "kill", "partition", "fairness", "fairness-kill")
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.requests, args.fairness_s, args.fairness_policy, args.only))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if "forwarding" in report:
        fwd = report["forwarding"]
        print(
            f"forwarding ({fwd['requests_each']} each): decided here p50 "
            f"{fwd['decided_here_ms']['p50']:.2f} ms p90 {fwd['decided_here_ms']['p90']:.2f} ms; "
            f"forwarded p50 {fwd['forwarded_ms']['p50']:.2f} ms p90 "
            f"{fwd['forwarded_ms']['p90']:.2f} ms; ratio {fwd['p50_ratio']:.2f}"
        )
    if "kill" in report:
        k = report["kill"]
        print(
            f"kill -9: {k['requests']} requests, {k['not_200']} not 200, longest gap "
            f"{k['longest_gap_ms']:.0f} ms, slowest {k['slowest_ms']:.0f} ms "
            f"(median {k['median_ms']:.0f} ms), peaks {k['peak_per_endpoint']}"
        )
    if "partition" in report:
        p = report["partition"]
        print(
            f"partition: {p['requests']} requests, {p['not_200']} not 200, rejoined "
            f"{p['rejoined_after_ms']:.0f} ms after the cut ended, peaks {p['peak_per_endpoint']}"
        )
    for runs in (report.get("fairness", {}), report.get("fairness-kill", {})):
        for name, f in runs.items():
            if name != "policy":
                print_fairness(runs["policy"], name, f)
    return 0


def print_fairness(policy: str, name: str, f: dict) -> None:
    print(
        f"fairness ({policy}), {name}: {f['requests']} requests, "
        f"{f['not_200']} not 200, "
        f"{f['priority_inversions']} priority inversions in {f['decisions_logged']} decisions, "
        f"peaks {f['peak_per_endpoint']} (limit {f['limit']}), VTC gap {f['vtc_gap']:.0f} "
        f"(bound {f['vtc_bound']})"
    )
    if "vtc_gap_before_kill" in f:
        print(
            f"  decider killed at {f['killed_after_s']:.0f} s, serving again "
            f"{f['restarted_after_s']:.2f} s later: VTC gap before the kill "
            f"{f['vtc_gap_before_kill']:.0f}, from the restart {f['vtc_gap_from_restart']:.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
