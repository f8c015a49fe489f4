"""A simulation makes no reference cycles, so `simulate` may pause the
cycle collector (`epp.sim.runner`)."""

import gc
from pathlib import Path

import pytest
import yaml

from epp.sim.runner import simulate
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload

ROOT = Path(__file__).resolve().parents[3]

# Eviction, disaggregation with a prefill timeout, a failing server, the
# precise index fed KV events from restarting servers, and a burst.
SCENARIOS = ["eviction", "pd-prefill-timeout", "server-failure", "precise-restarts", "burst"]


def shortened(name: str, seconds: float = 8.0):
    document = yaml.safe_load((ROOT / "config" / "scenarios" / f"{name}.yaml").read_text())
    document["duration_s"] = seconds
    return parse_scenario(document, ROOT / "config" / "scenarios")


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_run_leaves_no_cyclic_garbage(name):
    scenario = shortened(name)
    arrivals = workload(scenario)
    gc.disable()
    try:
        for policy in ["epp", *scenario.baselines]:
            gc.collect()  # the previous simulation's own structure
            kept = simulate(scenario, arrivals, policy)
            assert gc.collect() == 0, policy  # while `kept` holds this one's
            del kept
    finally:
        gc.enable()


@pytest.mark.parametrize("enabled", [True, False])
def test_simulate_leaves_the_cycle_collector_as_it_found_it(enabled):
    scenario = shortened("demo", 2.0)
    (gc.enable if enabled else gc.disable)()
    try:
        simulate(scenario, workload(scenario), "epp")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
