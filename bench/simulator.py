"""Simulator speed: `python -m bench.simulator [--json] [--requests N]`.

Simulates N (default 100,000) requests on 8 servers under ours (the real
FlowController and Scheduler, default configuration) and reports simulated
requests completed per wall-clock second (`sim_requests_per_s`, target
>= 50,000). The same run simulates the round-robin baseline, which calls no
EPP code: `epp_share` is the fraction of ours' wall time spent beyond it
(flow control, scheduling, the prompts' block hashes), so the numbers
compare across machines. `sim_requests_per_cpu_s` counts this thread's CPU
time instead of wall time, which other processes on a shared machine
disturb less.
"""

from __future__ import annotations

import argparse
import json
import time

from epp.sim.runner import simulate
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload

TARGET = 50_000
RATE_RPS = 200.0


def scenario_document(requests: int) -> dict:
    return {
        "name": "bench",
        "seed": 1,
        "duration_s": requests / RATE_RPS,
        "pool": {
            "servers": 8,
            "max_num_seqs": 32,
            "prefill_ms_per_token": 0.05,
            "decode_ms_per_token": 5,
            "kv_blocks": 8000,
            "block_size": 16,
        },
        "objectives": [{"name": "standard", "priority": 0}],
        "tenants": [
            {
                "name": f"t{index}",
                "objective": "standard",
                "rate_rps": RATE_RPS / 4,
                "arrival": "poisson",
                "prompt_tokens": {"uniform": [100, 400]},
                "output_tokens": {"uniform": [10, 40]},
            }
            for index in range(4)
        ],
        "baselines": ["round-robin"],
        "isolation": False,
    }


def measure(requests: int) -> dict:
    scenario = parse_scenario(scenario_document(requests))
    arrivals = workload(scenario)
    results = {}
    for name in ("round-robin", "epp"):
        started, started_cpu = time.perf_counter(), time.thread_time()
        sim = simulate(scenario, arrivals, name)
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - started_cpu
        completed = sum(1 for r in sim.requests if r.outcome == "completed")
        results[name] = (completed, elapsed, cpu)
    completed, elapsed, cpu = results["epp"]
    baseline_elapsed = results["round-robin"][1]
    return {
        "sim_requests_per_s": completed / elapsed,
        "sim_requests_per_cpu_s": completed / cpu,
        "requests": len(arrivals),
        "completed": completed,
        "wall_s": elapsed,
        "round_robin_requests_per_s": results["round-robin"][0] / baseline_elapsed,
        "epp_share": 1 - baseline_elapsed / elapsed,
        "us_per_request": 1e6 * elapsed / len(arrivals),
        "target": TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    result = measure(args.requests)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
