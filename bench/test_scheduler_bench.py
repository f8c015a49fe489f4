"""pytest-benchmark view of `bench.scheduler`: one scheduling decision with
the default scorers and a 2 KB prompt, and the xxh64 baseline.

Run with `python -m pytest bench/test_scheduler_bench.py`.
"""

import pytest
from xxhash import xxh64_intdigest

from bench.scheduler import PROMPT_CHARS, Workload


def test_baseline_xxh64_of_2kb(benchmark):
    data = ("x" * PROMPT_CHARS).encode()
    benchmark(xxh64_intdigest, data)


@pytest.mark.parametrize("size", [8, 64, 512])
def test_one_scheduling_decision(benchmark, size):
    workload = Workload(size)
    for _ in range(500):
        workload.decide(workload.request())
    benchmark.pedantic(workload.decide, setup=lambda: ((workload.request(),), {}), rounds=2000)
