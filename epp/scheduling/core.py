"""The core, wired: the one place that puts gate, scheduler and flow
controller together, for the live EPP (`epp.serve.server`) and the simulator
(`epp.sim.policies`) alike.

    pool snapshot --> gate (build_gate) --credits--> Scheduler (the placer)
                          \\                            /
                           +---> FlowController <-----+

Both shells read the pool through an `EndpointStore`'s `snapshot` and pass
their own clock (monotonic live, virtual in the simulator) and random source.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import Credits, Gate
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.gates import build_gate
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.stages import PrefillCredits, stage_gate


@dataclass(slots=True)
class Core:
    """The wired core. `credits` is the gate's per-endpoint part (adaptive or
    concurrency; None when the configured gate has neither), shared with the
    scheduler."""

    controller: FlowController
    gate: Gate
    credits: Credits | None
    scheduler: Scheduler
    pool: Callable[[], PoolSnapshot]
    clock: Callable[[], float]
    prefill_credits: PrefillCredits | None = None
    """The prefill stage's credits under P/D (`epp.scheduling.stages`)."""

    def reschedule(self, config: SchedulingConfig, rng: random.Random) -> Scheduler:
        """Place later requests with a scheduler built from `config` (a
        reload); the gate and its credits stay, so nothing in flight is lost."""
        self.scheduler = Scheduler(
            config, self.pool, self.clock, rng, self.credits, self.prefill_credits
        )
        self.controller.placer = self.scheduler
        return self.scheduler


def build_core(
    flow_control: FlowControlConfig,
    scheduling: SchedulingConfig,
    pool: Callable[[], PoolSnapshot],
    clock: Callable[[], float],
    rng: random.Random,
    on_flows_collected: Callable[[list[FlowKey]], None] | None = None,
) -> Core:
    """Gate, scheduler and flow controller for `flow_control` and
    `scheduling`, reading the pool from `pool` at the time `clock` gives."""
    gate, credits = build_gate(flow_control.gate, pool, clock)
    gate, prefill = stage_gate(gate, flow_control.gate.max_per_prefill_endpoint, scheduling)
    scheduler = Scheduler(scheduling, pool, clock, rng, credits, prefill)
    controller = FlowController(flow_control, gate, scheduler, on_flows_collected)
    return Core(controller, gate, credits, scheduler, pool, clock, prefill)
