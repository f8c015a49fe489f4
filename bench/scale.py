"""How far `epp serve --workers N` can scale: the core owner's CPU per
decision and a protocol worker's CPU per request, by pool size, through a
real Envoy, and the number of workers one owner can keep busy.

    python -m bench.scale [--endpoints 8,64,512] [--json]

For each pool size, `epp serve --workers 1` runs behind a one-thread Envoy
with a pool of that many endpoints (127.0.0.1 and up, on the port of one
fast stand-in model server: the direct Envoy of config/envoy/direct.yaml,
listening on 0.0.0.0 so every loopback address reaches it; scraping slowed
to `--refresh-metrics-interval`, 1 h by default, as in bench.workers: the
request path is what is measured, the scrape cost is bench.scrape's). The
load is `bench.extproc_e2e.Load`: closed loop, then a fixed rate. CPU is
user + system from /proc/<pid>/stat, per request.

Per pool size, per load: `owner_us` (the owner's CPU per decision: one
request is one decision), `worker_us` (the worker's CPU per request), and
`workers_per_owner` = `worker_us / owner_us`: what one owner can decide per
second (1 / owner_us) over what one worker can carry (1 / worker_us), the
speed-up over one worker that N workers reach before the owner saturates
(`speedup` gives min(N, workers_per_owner) for N = 1, 2, 4, 8, 16). This is
a projection from CPU per request, on the assumption that each worker and
the owner has a core of its own; a machine with 2 cores cannot show the
measured one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys

from bench.extproc_e2e import Load
from bench.workers import split_way
from epp.demo.envoy_process import CONFIG_DIR, running_envoy
from tests.support.epp_process import running_epp

WORKER_COUNTS = (1, 2, 4, 8, 16)


def pool(endpoints: int, port: int) -> str:
    """`endpoints` loopback addresses on `port`: 127.0.0.1 ... 127.0.0.250, 127.0.1.1 ..."""
    return ",".join(f"127.0.{n // 250}.{n % 250 + 1}:{port}" for n in range(endpoints))


def figures(owner_us: float, worker_us: float) -> dict:
    per_owner = worker_us / owner_us
    return {
        "owner_us": owner_us,
        "worker_us": worker_us,
        "workers_per_owner": round(per_owner, 2),
        "speedup": {str(n): round(min(n, per_owner), 2) for n in WORKER_COUNTS},
    }


async def measure(load: Load, sizes: list[int], refresh: str) -> dict:
    result: dict = {"refresh_metrics_interval": refresh, "rate": load.rate, "by_endpoints": {}}
    async with running_envoy(
        epp_port=0, template=CONFIG_DIR / "direct.yaml", LISTEN_ADDRESS="0.0.0.0"
    ) as model_server:
        for size in sizes:
            flags = (
                f"--endpoints={pool(size, model_server.listen_port)}",
                "--log-level=info",
                f"--refresh-metrics-interval={refresh}",
                "--workers=1",
            )
            async with contextlib.AsyncExitStack() as stack:
                epp = await stack.enter_async_context(running_epp(*flags))
                gateway = await stack.enter_async_context(running_envoy(epp_port=epp.ports["grpc"]))
                way = split_way(epp, gateway)
                measured = (await load.drive({"split": way}))["split"]
            result["by_endpoints"][str(size)] = {
                "closed": figures(measured.cpu_closed["owner"], measured.cpu_closed["worker"]),
                "at_rate": figures(measured.cpu_at_rate["owner"], measured.cpu_at_rate["worker"]),
                "closed_rps": round(measured.closed.rps, 1),
                "errors": measured.closed.errors,
            }
    result["load_average"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--endpoints", default="8,64,512", help="pool sizes, comma-separated")
    parser.add_argument("--refresh-metrics-interval", default="1h")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0, help="closed-loop run length")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
    parser.add_argument("--rate-seconds", type=float, default=4.0, help="open-loop time")
    args = parser.parse_args(argv)
    load = Load(args.concurrency, args.seconds, args.rate, args.rate_seconds, rounds=1)
    sizes = [int(size) for size in args.endpoints.split(",")]
    result = asyncio.run(measure(load, sizes, args.refresh_metrics_interval))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
