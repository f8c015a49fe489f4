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
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import deque

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


def pick_us(size: int, decisions: int, seed: int = 1) -> float:
    """Microseconds per decision over a pool of `size` endpoints."""
    rng = random.Random(seed)
    pool = make_pool(size, rng)
    gate = ConcurrencyGate(max_per_endpoint=32)
    scheduler = Scheduler(SchedulingConfig(), lambda: pool, lambda: NOW, rng, gate)
    prompts = make_prompts(256, rng)
    requests = [
        FlowRequest(
            request_id=str(index),
            fairness_id="bench",
            priority=0,
            arrival=NOW,
            payload=InferenceRequest(
                model="m", target_model="m", prompt=prompts[index % len(prompts)]
            ),
        )
        for index in range(decisions)
    ]
    in_flight: deque[FlowRequest] = deque()
    window = IN_FLIGHT_PER_ENDPOINT * size
    place = scheduler.place
    started = time.thread_time()
    for request in requests:
        request.endpoint = place(request)
        gate.on_dispatch(request)
        in_flight.append(request)
        if len(in_flight) > window:
            gate.on_complete(in_flight.popleft())
    return (time.thread_time() - started) / decisions * 1e6


def xxh64_2kb_us(rounds: int) -> float:
    """The baseline: microseconds for one xxh64 of a 2 KB prompt."""
    data = ("x" * PROMPT_CHARS).encode()
    started = time.thread_time()
    for _ in range(rounds):
        xxh64_intdigest(data)
    return (time.thread_time() - started) / rounds * 1e6


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
    args = parser.parse_args(argv)
    result = run(args.decisions)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value:.3f}" if isinstance(value, float) else f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
