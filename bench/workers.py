"""CPU per request of `epp serve --workers 1` (core owner + one protocol
worker) against `epp serve` (one process), through a real Envoy, in one run.

    python -m bench.workers --json

Both EPPs are up for the whole run, each behind its own gateway Envoy (one
thread, so one connection to the EPP), with the same pool of `--endpoints`
endpoints (default 64): the addresses 127.0.0.1 ... 127.0.0.N on the port of
one fast stand-in model server (config/envoy/direct.yaml, an Envoy answering
by itself, listening on 0.0.0.0 so that every loopback address reaches it).
The load is `bench.extproc_e2e.Load`: closed loop per way in turn, then a
fixed rate in interleaved rounds. CPU is user + system from /proc/<pid>/stat:
the single process's, and the owner's and the worker's, per request.

Scraping is slowed to `--refresh-metrics-interval` (default 1 h) on both,
so that what is compared is the request path: at 64 endpoints and the 50 ms
default a scrape round costs the owner more than the decisions do (issue
29's scrape cost, measured apart in bench.scrape).

Prints one JSON object: per way the CPU per request closed loop and at the
rate, `ratio_closed` / `ratio_at_rate` (owner + worker over the single
process) and `owner_share_closed` / `owner_share_at_rate` (owner over owner
+ worker), with the targets (ratio <= 1.25, owner share <= 0.15).

`--against REF` adds a third way in the same run: `--workers 1` of epp at
git REF (from `git archive`), reported as `before` (its owner and worker
CPU per request and its ratio and owner share against the same single
process), so a change to the owner is measured alternately with its base.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile

from bench.extproc_e2e import Load, Way, url_of
from epp.demo.envoy_process import CONFIG_DIR, running_envoy
from tests.support.epp_process import running_epp

TARGETS = {"ratio": 1.25, "owner_share": 0.15}
WORKER_STARTED = re.compile(r"epp worker 0 started \(pid (\d+)\)")


def split_way(epp, gateway) -> Way:
    found = WORKER_STARTED.search(epp.log())
    assert found is not None, epp.log()
    return Way(url_of(gateway), {"owner": epp.process.pid, "worker": int(found.group(1))})


def split_figures(one, two) -> dict:
    """Owner and worker CPU per request of the split way `two` against the single `one`."""
    result: dict = {}
    for mode, single_cpu, split_cpu in (
        ("closed", one.cpu_closed, two.cpu_closed),
        ("at_rate", one.cpu_at_rate, two.cpu_at_rate),
    ):
        total = split_cpu["owner"] + split_cpu["worker"]
        result[f"owner_cpu_us_{mode}"] = split_cpu["owner"]
        result[f"worker_cpu_us_{mode}"] = split_cpu["worker"]
        result[f"ratio_{mode}"] = round(total / single_cpu["epp"], 3)
        result[f"owner_share_{mode}"] = round(split_cpu["owner"] / total, 3)
    return result


async def measure(load: Load, endpoints: int, refresh: str, before: str | None = None) -> dict:
    async with contextlib.AsyncExitStack() as stack:
        model_server = await stack.enter_async_context(
            running_envoy(epp_port=0, template=CONFIG_DIR / "direct.yaml", LISTEN_ADDRESS="0.0.0.0")
        )
        port = model_server.listen_port
        pool = ",".join(f"127.0.0.{n}:{port}" for n in range(1, endpoints + 1))
        flags = (f"--endpoints={pool}", "--log-level=info", f"--refresh-metrics-interval={refresh}")
        single = await stack.enter_async_context(running_epp(*flags))
        split = await stack.enter_async_context(running_epp(*flags, "--workers=1"))
        single_gateway = await stack.enter_async_context(
            running_envoy(epp_port=single.ports["grpc"])
        )
        split_gateway = await stack.enter_async_context(running_envoy(epp_port=split.ports["grpc"]))
        ways = {
            "single": Way(url_of(single_gateway), {"epp": single.process.pid}),
            "workers": split_way(split, split_gateway),
        }
        if before is not None:
            tree = stack.enter_context(tempfile.TemporaryDirectory(prefix="epp-bench-before-"))
            archive = subprocess.run(["git", "archive", before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
            old = await stack.enter_async_context(
                running_epp(*flags, "--workers=1", env={"PYTHONPATH": tree, "PYTHONSAFEPATH": "1"})
            )
            old_gateway = await stack.enter_async_context(running_envoy(epp_port=old.ports["grpc"]))
            ways["before"] = split_way(old, old_gateway)
        results = await load.drive(ways)
    one, two = results["single"], results["workers"]
    result: dict = {"endpoints": endpoints, "refresh_metrics_interval": refresh}
    result["single_cpu_us_closed"] = one.cpu_closed["epp"]
    result["single_cpu_us_at_rate"] = one.cpu_at_rate["epp"]
    result |= split_figures(one, two)
    result["requests_closed"] = [one.closed.requests, two.closed.requests]
    result["requests_at_rate"] = [len(one.latencies), len(two.latencies)]
    if before is not None:
        result["before"] = {"ref": before, **split_figures(one, results["before"])}
    result["single_rps"] = round(one.closed.rps, 1)
    result["workers_rps"] = round(two.closed.rps, 1)
    result["single_p50_ms"] = round(one.p(0.5), 3)
    result["workers_p50_ms"] = round(two.p(0.5), 3)
    result["single_p99_ms"] = round(one.p(0.99), 3)
    result["workers_p99_ms"] = round(two.p(0.99), 3)
    result["errors"] = one.closed.errors + two.closed.errors
    result["rate"] = load.rate
    result["concurrency"] = load.concurrency
    result["load_average"] = os.getloadavg()[0]
    result["targets"] = TARGETS
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--endpoints", type=int, default=64, help="pool size (at most 254)")
    parser.add_argument("--refresh-metrics-interval", default="1h")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0, help="closed-loop run length")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
    parser.add_argument("--rate-seconds", type=float, default=8.0, help="open-loop time per way")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved open-loop rounds")
    parser.add_argument("--against", metavar="REF", help="also --workers 1 of epp at git REF")
    args = parser.parse_args(argv)
    load = Load(args.concurrency, args.seconds, args.rate, args.rate_seconds, args.rounds)
    result = asyncio.run(measure(load, args.endpoints, args.refresh_metrics_interval, args.against))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
