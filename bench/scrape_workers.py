"""What reading the model servers' metrics costs the core owner of
`epp serve --workers N`, idle, at the reference's 50 ms default.

    python3 -m bench.scrape_workers [--endpoints 64 512] [--workers 2] [--against REF]

One child process serves a vLLM metrics page (`bench.scrape`'s pages, whose
values change between reads) on each of `--endpoints` loopback ports; a real
`epp serve --workers N --refresh-metrics-interval=50ms` reads them with no
requests. Over `--seconds` after a warm-up: the owner's CPU (user + system,
/proc/<pid>/stat) as a share of one core, the workers' together, and the
pages served per second (one page server on a shared machine may serve
fewer than endpoints / 50 ms, so `owner_us_per_read` is the owner's CPU per
page served and `owner_share_full_rate` what it implies at endpoints / 50 ms).

`--against REF`: the same for epp at git REF (from `git archive`), then this
tree, alternately, `--rounds` times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

from bench.scrape import INTERVAL, _free_ports, alternately, serve_pages
from tests.support.epp_process import running_epp

WORKER_STARTED = re.compile(r"epp worker \d+ started \(pid (\d+)\)")
WARMUP_S = 3.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measure(endpoints: int, workers: int, seconds: float) -> dict[str, float]:
    ports = _free_ports(endpoints)
    context = multiprocessing.get_context("spawn")
    ready, served = context.Event(), context.Value("q", 0, lock=False)
    page_server = ("vllm", ports, ready, served, 1024)
    server = context.Process(target=serve_pages, args=page_server, daemon=True)
    server.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the page server did not start")
        pool = ",".join(f"127.0.0.1:{port}" for port in ports)
        flags = (f"--endpoints={pool}", f"--workers={workers}", "--refresh-metrics-interval=50ms")
        async with running_epp(*flags, ready_timeout=60) as epp:
            await asyncio.sleep(WARMUP_S)
            worker_pids = [int(pid) for pid in WORKER_STARTED.findall(epp.log())]
            pids = [epp.process.pid, *worker_pids]
            before = [cpu_seconds(pid) for pid in pids]
            pages_before, started = served.value, time.monotonic()
            await asyncio.sleep(seconds)
            after = [cpu_seconds(pid) for pid in pids]
            pages_after, wall = served.value, time.monotonic() - started
    finally:
        server.terminate()
        server.join(5)
    owner = after[0] - before[0]
    workers_cpu = sum(after[1:]) - sum(before[1:])
    reads = pages_after - pages_before
    per_read = owner / reads if reads else float("nan")
    return {
        "endpoints": endpoints,
        "workers": workers,
        "owner_share": round(owner / wall, 3),
        "workers_share": round(workers_cpu / wall, 3),
        "pages_per_s": round(reads / wall, 1),
        "full_rate_per_s": round(endpoints / INTERVAL, 1),
        "owner_us_per_read": round(per_read * 1e6, 1),
        "owner_share_full_rate": round(per_read * endpoints / INTERVAL, 3),
        "load_average": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per pool")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--against", metavar="REF", help="epp at git REF, then this tree")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --against")
    args = parser.parse_args(argv)
    if args.against:
        options = ["--endpoints", *map(str, args.endpoints), "--workers", str(args.workers)]
        options += ["--seconds", str(args.seconds)]
        json.dump(alternately(__file__, args.against, options, args.rounds), sys.stdout, indent=2)
        print()
        return 0
    results = [asyncio.run(measure(n, args.workers, args.seconds)) for n in args.endpoints]
    json.dump(results, sys.stdout, indent=None if args.json else 2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
