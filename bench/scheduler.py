"""Cost of one scheduling decision: `python -m bench.scheduler [--json]`.

Each decision places a new request with a 2 KB prompt through the default
scheduler (queue 2, KV cache 2, prefix 3; max-score picker) behind a
concurrency gate (32 credits per endpoint, about 8 requests in flight on
each), over pools of 8, 64 and 512 endpoints with fresh metrics.
Prompts share one of 32 system prompts (1 KB) followed by a 1 KB unique
tail, so the prefix index holds real matches. The baseline, measured in the
same run, is one xxh64 of a 2 KB string: the ratio says how many such
hashes one decision costs, which is comparable across machines. Times are
this thread's CPU time, so other processes on a shared machine inflate them
less than wall-clock time would.

With `--scrape`, it also measures what keeping 64 endpoints' metrics fresh
at 20 Hz costs: 64 servers in a child process serve a real-size vLLM page
(~450 lines), the scraper reads them for a few seconds, and the result is
the share of one core this process spent (HTTP client, parsing, store) and
the read rate it achieved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from xxhash import xxh64_intdigest

from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler

POOL_SIZES = (8, 64, 512)
PROMPT_CHARS = 2048
TARGET_PICK_US_64 = 50.0
NOW = 1000.0
IN_FLIGHT_PER_ENDPOINT = 8


def make_pool(size: int, rng: random.Random) -> PoolSnapshot:
    endpoints = tuple(
        Endpoint(
            name=f"pod-{index}",
            address=f"10.0.{index // 250}.{index % 250 + 1}:8000",
            metrics=EndpointMetrics(
                waiting=float(rng.randrange(5)),
                running=float(rng.randrange(16)),
                kv_usage=rng.uniform(0.0, 0.7),
                updated_at=NOW,
            ),
        )
        for index in range(size)
    )
    return PoolSnapshot(endpoints=endpoints, version=1, membership=1)


def make_prompts(count: int, rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz "
    systems = ["".join(rng.choices(letters, k=PROMPT_CHARS // 2)) for _ in range(32)]
    return [
        rng.choice(systems) + "".join(rng.choices(letters, k=PROMPT_CHARS // 2))
        for _ in range(count)
    ]


class Workload:
    """A default scheduler over a pool of `size` endpoints and a stream of
    new requests; `decide()` makes one decision and keeps about
    IN_FLIGHT_PER_ENDPOINT requests per endpoint in flight."""

    def __init__(self, size: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        pool = make_pool(size, rng)
        self.gate = ConcurrencyGate(max_per_endpoint=32)
        self.scheduler = Scheduler(SchedulingConfig(), lambda: pool, lambda: NOW, rng, self.gate)
        self.prompts = make_prompts(256, rng)
        self.in_flight: deque[FlowRequest] = deque()
        self.window = IN_FLIGHT_PER_ENDPOINT * size
        self.count = 0

    def request(self) -> FlowRequest:
        self.count += 1
        prompt = self.prompts[self.count % len(self.prompts)]
        return FlowRequest(
            request_id=str(self.count),
            fairness_id="bench",
            priority=0,
            arrival=NOW,
            payload=InferenceRequest(model="m", target_model="m", prompt=prompt),
        )

    def decide(self, request: FlowRequest) -> None:
        request.endpoint = self.scheduler.place(request)  # type: ignore[assignment]
        self.gate.on_dispatch(request)
        self.in_flight.append(request)
        if len(self.in_flight) > self.window:
            self.gate.on_complete(self.in_flight.popleft())


def pick_us(size: int, decisions: int, seed: int = 1) -> float:
    """Microseconds per decision over a pool of `size` endpoints (requests
    are built before the clock starts)."""
    workload = Workload(size, seed)
    requests = [workload.request() for _ in range(decisions)]
    decide = workload.decide
    started = time.thread_time()
    for request in requests:
        decide(request)
    return (time.thread_time() - started) / decisions * 1e6


def xxh64_2kb_us(rounds: int) -> float:
    """The baseline: microseconds for one xxh64 of a 2 KB prompt."""
    data = ("x" * PROMPT_CHARS).encode()
    started = time.thread_time()
    for _ in range(rounds):
        xxh64_intdigest(data)
    return (time.thread_time() - started) / rounds * 1e6


VLLM_PAGE = Path(__file__).parents[1] / "tests/integration/datalayer/pages/vllm_v1_0.10.txt"


async def serve_metrics(count: int) -> None:
    """Serve the vLLM page on `count` loopback ports; print them as JSON."""
    from aiohttp import web

    from tests.support.http_server import http_sites

    page = VLLM_PAGE.read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page)

    async with http_sites({"/metrics": metrics}, count) as ports:
        print(json.dumps(ports), flush=True)
        await asyncio.Event().wait()


async def scrape_for(
    ports: list[int], seconds: float, interval: float
) -> tuple[float, float, float]:
    """Shares of one core used in user space and in all (user + kernel: on
    loopback the kernel's TCP work for both ends lands partly on the
    sender), and reads per second achieved, while scraping."""
    from epp.datalayer.endpoints import EndpointSpec
    from epp.datalayer.scraper import MetricsScraper
    from epp.datalayer.store import EndpointStore

    store = EndpointStore(EndpointSpec(str(port), f"127.0.0.1:{port}") for port in ports)
    async with MetricsScraper(store, interval=interval) as scraper:
        await asyncio.sleep(1.0)
        reads, before, wall = scraper.reads, os.times(), time.monotonic()
        await asyncio.sleep(seconds)
        reads = scraper.reads - reads
        after, wall = os.times(), time.monotonic() - wall
    user = after.user - before.user
    return user / wall, (user + after.system - before.system) / wall, reads / wall


def scrape_cost(endpoints: int = 64, interval: float = 0.05, seconds: float = 3.0) -> dict:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.scheduler", "--serve-metrics", str(endpoints)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ports = json.loads(server.stdout.readline())  # type: ignore[union-attr]
        user, total, rate = asyncio.run(scrape_for(ports, seconds, interval))
    finally:
        server.terminate()
        server.wait()
    suffix = f"{endpoints}_at_{round(1 / interval)}hz"
    return {
        f"scrape_user_core_share_{suffix}": user,
        f"scrape_core_share_{suffix}": total,
        f"scrape_reads_per_s_{suffix}": rate,
    }


def run(decisions: int) -> dict[str, float | bool]:
    """Each pool size is timed three times (seeds 1-3), each time right after
    a baseline sample, and the fastest of each is kept: on a shared machine
    the minimum is the least disturbed measurement."""
    baselines = []
    result: dict[str, float | bool] = {}
    for size in POOL_SIZES:
        picks = []
        for seed in (1, 2, 3):
            baselines.append(xxh64_2kb_us(decisions * 20))
            picks.append(pick_us(size, decisions, seed))
        result[f"pick_us_{size}"] = min(picks)
    result["baseline_xxh64_2kb_us"] = min(baselines)
    result["pick_64_per_baseline"] = result["pick_us_64"] / result["baseline_xxh64_2kb_us"]
    result["target_pick_us_64"] = TARGET_PICK_US_64
    result["meets_target"] = result["pick_us_64"] <= TARGET_PICK_US_64
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--decisions", type=int, default=3000, help="decisions per pool size")
    parser.add_argument("--scrape", action="store_true", help="also measure metrics scraping")
    parser.add_argument("--serve-metrics", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_metrics:
        asyncio.run(serve_metrics(args.serve_metrics))
        return 0
    result = run(args.decisions)
    if args.scrape:
        result.update(scrape_cost())
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value:.3f}" if isinstance(value, float) else f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
