"""pytest-benchmark suites of the queue core's hot path.

Each round times BATCH enqueue + dispatch pairs at a steady queue depth (see
`bench.harness`), so the reported time divided by BATCH is the pair cost.
`python -m bench.queue_core` runs the fixed matrix with its baseline and
targets; these suites are for exploring one dimension at a time:

    python -m pytest bench/test_queue_core_bench.py --benchmark-columns=median
"""

from __future__ import annotations

import random

import pytest

from bench.harness import Setup, build
from epp.flowcontrol.config import Fairness

BATCH = 1_000
ROUNDS = 30


def run_pairs(benchmark, setup: Setup) -> None:
    controller, gate, factory = build(setup)
    enqueue, dispatch = controller.enqueue, controller.dispatch

    def pairs(requests):
        for request in requests:
            enqueue(request, 1.0)
            gate.credits = 1
            dispatch(1.0)

    benchmark.pedantic(pairs, setup=lambda: ((factory.batch(BATCH, 1.0),), {}), rounds=ROUNDS)
    assert controller.queued_requests == setup.queued


@pytest.mark.parametrize("queued", [1_000, 100_000, 1_000_000])
def test_pair_by_queue_depth(benchmark, queued):
    run_pairs(benchmark, Setup(queued=queued, flows=40_000))


@pytest.mark.parametrize("flows", [10, 5_000, 100_000])
def test_pair_by_flow_count(benchmark, flows):
    run_pairs(benchmark, Setup(queued=100_000, flows=flows))


@pytest.mark.parametrize("fairness", [Fairness.ROUND_ROBIN, Fairness.VTC])
@pytest.mark.parametrize("bands", [1, 8])
def test_pair_by_bands_and_fairness(benchmark, bands, fairness):
    run_pairs(benchmark, Setup(queued=100_000, flows=5_000 * bands, bands=bands, fairness=fairness))


@pytest.mark.parametrize("fairness", [Fairness.ROUND_ROBIN, Fairness.VTC])
def test_cancellation_heavy_mix(benchmark, fairness):
    """Per round: BATCH times enqueue two, cancel a random queued one (a
    client gone), dispatch one; the depth stays at 100k."""
    setup = Setup(queued=100_000, flows=40_000, fairness=fairness)
    controller, gate, factory = build(setup)
    rng = random.Random(7)
    live = []

    def mix(requests):
        for first, second in zip(requests[::2], requests[1::2], strict=True):
            controller.enqueue(first, 1.0)
            controller.enqueue(second, 1.0)
            live.append(first)
            live.append(second)
            while not controller.cancel(live.pop(rng.randrange(len(live))), 1.0):
                pass
            gate.credits = 1
            controller.dispatch(1.0)
            if len(live) > 10_000:
                del live[:5_000]

    benchmark.pedantic(mix, setup=lambda: ((factory.batch(2 * BATCH, 1.0),), {}), rounds=ROUNDS)
    assert controller.queued_requests == setup.queued
