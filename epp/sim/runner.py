"""Runs a scenario: ours, its variants and the baselines over the same
arrivals, and each tier alone under each policy (the isolation reference)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from epp.config.loader import EppConfig
from epp.config.precise import TokenizerBackend
from epp.sim.engine import Simulation
from epp.sim.policies import (
    EppPolicy,
    LeastQueuePolicy,
    RoundRobinPolicy,
    with_fairness,
    without_disaggregation,
)
from epp.sim.scenario import BASELINES, Scenario
from epp.sim.workload import Arrived, workload

Progress = Callable[[float], None]


@dataclass(slots=True)
class ScenarioRun:
    """The main run of every policy, and per policy the runs of each
    objective alone (objective name -> simulation)."""

    scenario: Scenario
    arrivals: list[Arrived]
    runs: dict[str, Simulation] = field(default_factory=dict)
    alone: dict[str, dict[str, Simulation]] = field(default_factory=dict)


def policy_names(scenario: Scenario) -> list[str]:
    return ["epp", *(variant.name for variant in scenario.variants), *scenario.baselines]


def _config_for(scenario: Scenario, name: str) -> EppConfig:
    for variant in scenario.variants:
        if variant.name == name:
            if variant.config is not None:
                return variant.config
            assert variant.fairness is not None
            return with_fairness(scenario.epp_config, variant.fairness)
    if name == "aggregated":
        return without_disaggregation(scenario.epp_config)
    return scenario.epp_config


def tokenizes(config: EppConfig) -> bool:
    """Whether `config`'s token-producer asks a backend for the tokens."""
    settings = config.tokenizer
    return settings is not None and settings.backend is not TokenizerBackend.ESTIMATE


def keeps_prefix_store(config: EppConfig) -> bool:
    """Whether `config`'s token-producer encodes only what its prefix store lacks."""
    settings = config.tokenizer
    return settings is not None and settings.keeps_prefix_store


def simulate(
    scenario: Scenario,
    arrivals: list[Arrived],
    name: str,
    progress: Progress | None = None,
    measure_idle: bool = False,
) -> Simulation:
    """One run of policy `name` over `arrivals` (`measure_idle`: with the
    servers' idle capacity while the policy queues, `Simulation.idle`)."""
    with _cycle_collection_paused():
        return _simulate(scenario, arrivals, name, progress, measure_idle)


@contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """A simulation makes no reference cycles but its own structure
    (`tests/unit/sim/test_sim_no_cycles.py`), so the cycle collector would
    find nothing in the objects a run allocates; yet each of its full passes
    walks every object of the process (the imported modules' included):
    about 3% of a run's instructions (`bench.instructions`). Paused for a
    simulation, restored after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _simulate(
    scenario: Scenario,
    arrivals: list[Arrived],
    name: str,
    progress: Progress | None,
    measure_idle: bool,
) -> Simulation:
    config = _config_for(scenario, name)
    flow = config.flow_control

    def weights(priority: int) -> tuple[float, float]:
        band = flow.band(priority)
        return band.input_weight, band.output_weight

    # The baselines do not disaggregate: every server serves both stages.
    sim = Simulation(
        scenario,
        arrivals,
        weights,
        progress,
        aggregated=name in BASELINES,
        measure_idle=measure_idle,
        tokenizes=name not in BASELINES and tokenizes(config),
        token_store=name not in BASELINES and keeps_prefix_store(config),
    )
    if name == "round-robin":
        policy = RoundRobinPolicy(sim)
    elif name == "least-queue":
        policy = LeastQueuePolicy(sim, scenario.seed)
    else:
        policy = EppPolicy(sim, config, scenario.seed)
    sim.run(policy)
    return sim


def run_scenario(
    scenario: Scenario, progress: Callable[[str], Progress] | None = None
) -> ScenarioRun:
    """Every policy over the same arrivals; `progress(label)` gives the
    callback that follows the run so labelled (virtual time in seconds)."""
    arrivals = workload(scenario)
    result = ScenarioRun(scenario, arrivals)
    names = policy_names(scenario)
    for name in names:
        result.runs[name] = simulate(scenario, arrivals, name, progress(name) if progress else None)
    if not scenario.isolation:
        return result
    tiers = sorted({tenant.objective for tenant in scenario.tenants})
    if len(tiers) < 2:
        return result
    for name in names:
        result.alone[name] = {}
        for tier in tiers:
            members = {i for i, t in enumerate(scenario.tenants) if t.objective == tier}
            alone = [request for request in arrivals if request.tenant in members]
            label = f"{name}, {tier} alone"
            result.alone[name][tier] = simulate(
                scenario, alone, name, progress(label) if progress else None
            )
    return result
