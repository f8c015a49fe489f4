"""The queue core's hot path, measured in one process.

`python -m bench.queue_core [--json]` runs a fixed matrix and reports the
median cost of an enqueue+dispatch pair against a plain `heapq` push+pop pair
measured in the same run, how that cost scales with queue depth and flow
count, full async admit round trips per second, and memory per queued request.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import json
import random
import statistics
import sys
import time
import tracemalloc

from bench.harness import OnePlacer, Setup, build
from epp.flowcontrol.config import BandConfig, Fairness, FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.gate import OpenGate
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.core import Core
from epp.serve.admission import AdmissionController

TARGETS = {
    "ratio": ("<=", 2.0),
    "ratio_vtc": ("<=", 3.0),
    "scaling_queued": ("<=", 1.3),
    "scaling_flows": ("<=", 1.5),
    "admit_per_s": (">=", 100_000),
    "bytes_per_queued": ("<=", 1000),
}
PAIRS = 20_000
REPEATS = 7


class PairLoop:
    """A controller pre-filled to `setup.queued`; each sample times PAIRS
    enqueue + dispatch pairs at that steady depth."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self._controller, self._gate, self._factory = build(setup)

    def sample(self) -> float:
        controller, gate = self._controller, self._gate
        enqueue, dispatch = controller.enqueue, controller.dispatch
        requests = self._factory.batch(PAIRS, 1.0)
        gc.collect()
        start = time.perf_counter()
        for request in requests:
            enqueue(request, 1.0)
            gate.credits = 1
            dispatch(1.0)
        elapsed = time.perf_counter() - start
        assert controller.queued_requests == self.setup.queued
        return elapsed / PAIRS * 1e6


class HeapqBaseline:
    """heappush + heappop of (float, int) on a heap of 100k entries."""

    def __init__(self, size: int = 100_000) -> None:
        self._rng = random.Random(1)
        self._heap = [(self._rng.random(), i) for i in range(size)]
        heapq.heapify(self._heap)

    def sample(self) -> float:
        heap, push, pop = self._heap, heapq.heappush, heapq.heappop
        items = [(self._rng.random(), i) for i in range(PAIRS)]
        gc.collect()
        start = time.perf_counter()
        for item in items:
            push(heap, item)
            pop(heap)
        return (time.perf_counter() - start) / PAIRS * 1e6


def interleaved(loops: list) -> list[list[float]]:
    """REPEATS rounds; in each, one sample of every loop back to back, so a
    ratio taken within a round compares runs under the same machine load."""
    rounds = []
    for _ in range(REPEATS):
        rounds.append([loop.sample() for loop in loops])
    return rounds


def median_ratio(rounds: list[list[float]], top: int, bottom: int) -> float:
    return statistics.median(r[top] / r[bottom] for r in rounds)


def median_cost(rounds: list[list[float]], index: int) -> float:
    return statistics.median(r[index] for r in rounds)


def admit_per_s(count: int = 200_000) -> float:
    """Admit-to-dispatched round trips per second through the asyncio
    controller, with an open gate and completion right after dispatch."""
    config = FlowControlConfig(default_band=BandConfig(priority=0))
    core = FlowController(config, OpenGate(), OnePlacer())
    requests = [
        FlowRequest(f"req-{i}", f"tenant-{i % 100}", 0, 0.0, 1024, 256) for i in range(count)
    ]

    async def run() -> float:
        admission = AdmissionController(Core(core))
        admit, complete = admission.admit, admission.complete
        usage = Usage(256, 10)  # the live path's parser makes it, not admission
        start = time.perf_counter()
        for request in requests:
            await admit(request)
            complete(request, usage)
        return count / (time.perf_counter() - start)

    gc.collect()
    return asyncio.run(run())


def bytes_per_queued(count: int = 1_000_000) -> float:
    """Memory per queued request at `count` queued, request objects included."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    controller, _, _ = build(Setup(queued=count, flows=40_000))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert controller.queued_requests == count
    return (after - before) / count


def run_matrix(progress) -> dict:
    results: dict = {}
    progress("8 bands x 5,000 flows x 100k queued: round-robin, vtc, global-strict")
    rounds = interleaved(
        [
            HeapqBaseline(),
            PairLoop(Setup(queued=100_000, flows=40_000)),
            PairLoop(Setup(queued=100_000, flows=40_000, fairness=Fairness.VTC)),
            PairLoop(Setup(queued=100_000, flows=40_000, fairness=Fairness.GLOBAL_STRICT)),
        ]
    )
    results["heapq_pair_us"] = median_cost(rounds, 0)
    results["pair_us"] = median_cost(rounds, 1)
    results["pair_us_vtc"] = median_cost(rounds, 2)
    results["pair_us_global_strict"] = median_cost(rounds, 3)
    results["ratio"] = median_ratio(rounds, 1, 0)
    results["ratio_vtc"] = median_ratio(rounds, 2, 0)
    results["ratio_global_strict"] = median_ratio(rounds, 3, 0)

    progress("queue depth: 1k and 1M queued, 8 bands x 5,000 flows, round-robin")
    rounds = interleaved(
        [
            PairLoop(Setup(queued=1_000, flows=40_000)),
            PairLoop(Setup(queued=1_000_000, flows=40_000)),
        ]
    )
    results["pair_us_1k_queued"] = median_cost(rounds, 0)
    results["pair_us_1m_queued"] = median_cost(rounds, 1)
    results["scaling_queued"] = median_ratio(rounds, 1, 0)

    progress("flow count: 10 and 100k flows, 8 bands, 100k queued, round-robin and vtc")
    rounds = interleaved(
        [
            PairLoop(Setup(queued=100_000, flows=10)),
            PairLoop(Setup(queued=100_000, flows=100_000)),
            PairLoop(Setup(queued=100_000, flows=10, fairness=Fairness.VTC)),
            PairLoop(Setup(queued=100_000, flows=100_000, fairness=Fairness.VTC)),
        ]
    )
    results["pair_us_10_flows"] = median_cost(rounds, 0)
    results["pair_us_100k_flows"] = median_cost(rounds, 1)
    results["scaling_flows"] = median_ratio(rounds, 1, 0)
    results["pair_us_vtc_10_flows"] = median_cost(rounds, 2)
    results["pair_us_vtc_100k_flows"] = median_cost(rounds, 3)
    results["scaling_flows_vtc"] = median_ratio(rounds, 3, 2)

    progress("admit round trips")
    results["admit_per_s"] = admit_per_s()
    progress("memory at 1M queued")
    results["bytes_per_queued"] = bytes_per_queued()

    results["targets"] = {
        name: {"target": f"{op} {limit}", "met": _meets(results[name], op, limit)}
        for name, (op, limit) in TARGETS.items()
    }
    results["all_targets_met"] = all(t["met"] for t in results["targets"].values())
    return results


def _meets(value: float, op: str, limit: float) -> bool:
    return value <= limit if op == "<=" else value >= limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    def progress(step: str) -> None:
        print(f"  {step} ...", file=sys.stderr, flush=True)

    results = run_matrix(progress)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if results["all_targets_met"] else 1
    print(f"{'metric':<26}{'value':>14}  target")
    for name, value in results.items():
        if isinstance(value, float | int) and not isinstance(value, bool):
            target = TARGETS.get(name)
            mark = ""
            if target:
                mark = f"{target[0]} {target[1]}  " + (
                    "met" if results["targets"][name]["met"] else "MISSED"
                )
            print(f"{name:<26}{value:>14.3f}  {mark}")
    return 0 if results["all_targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
