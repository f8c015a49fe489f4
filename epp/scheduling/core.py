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

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.config import FlowControlConfig, GateConfig, GateKind
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import AllGates, ConcurrencyGate, Credits, Gate, OpenGate, gate_parts
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.detectors import DetectorGate
from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.saturation import (
    DEFAULT_THRESHOLDS,
    SaturationThresholds,
    UtilizationGate,
    gate_saturation,
)
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.spec import PluginTimer
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
    load: InFlightLoad | None = None
    """What is in flight per endpoint, when a scheduling plugin reads it."""
    plugin_timer: PluginTimer | None = None
    max_per_prefill_endpoint: int = 0
    """The prefill credits per prefill endpoint a disaggregating reload gets."""

    def reschedule(self, config: SchedulingConfig, rng: random.Random) -> Scheduler:
        """Place later requests with a scheduler built from `config` (a
        reload), and read utilization against its saturation thresholds; the
        gate and its credits stay, so nothing in flight is lost. A reload
        that first names a plugin reading the in-flight load counts from
        then on; one that first disaggregates gets the prefill stage's
        credits from then on (they stay if a later reload stops)."""
        if self.prefill_credits is None:
            gate, prefill = stage_gate(self.gate, self.max_per_prefill_endpoint, config)
            if prefill is not None:
                self.gate = self.controller.gate = gate
                self.prefill_credits = prefill
        self.scheduler = Scheduler(
            config,
            self.pool,
            self.clock,
            rng,
            self.credits,
            self.prefill_credits,
            self.load,
            self.plugin_timer,
        )
        if self.load is None and self.scheduler.load is not None:
            self.load = self.scheduler.load
            self.gate = self.controller.gate = with_load(self.gate, self.load)
        self.controller.placer = self.scheduler
        for part in gate_parts(self.gate):
            if isinstance(part, UtilizationGate):
                part.retune(config.saturation)
        return self.scheduler

    def saturation(self) -> float:
        """The pool's saturation as the gate sees it now (the gauge's value)."""
        return gate_saturation(self.gate, self.pool())


def build_gate(
    config: GateConfig,
    pool: Callable[[], PoolSnapshot],
    clock: Callable[[], float],
    thresholds: SaturationThresholds = DEFAULT_THRESHOLDS,
) -> tuple[Gate, Credits | None]:
    """The gate `config` asks for, and its per-endpoint credits for the
    scheduler (None when neither the adaptive nor the concurrency kind is
    on; with both, the adaptive limits are the per-endpoint ones and the
    concurrency kind adds its pool-wide `max_in_flight`). The utilization
    kind reads `thresholds`. No kinds at all gives a gate that never closes.
    A configured detector replaces all of it (`epp.scheduling.detectors`)."""
    if config.detector is not None:
        detector_gate = DetectorGate(config.detector, pool, clock, config.usage_limits)  # type: ignore[arg-type]
        return detector_gate, detector_gate
    gates: list[Gate] = []
    credits: Credits | None = None
    if GateKind.ADAPTIVE in config.kinds:
        adaptive = AdaptiveGate(
            pool, clock, usage=config.usage_limits, blind_limit=config.max_per_endpoint
        )
        gates.append(adaptive)
        credits = adaptive
    if GateKind.CONCURRENCY in config.kinds:
        concurrency = ConcurrencyGate(
            config.max_in_flight, 0 if credits is not None else config.max_per_endpoint
        )
        gates.append(concurrency)
        credits = credits or concurrency
    if GateKind.UTILIZATION in config.kinds:
        gates.append(UtilizationGate(pool, clock, thresholds))
    if not gates:
        return OpenGate(), None
    if len(gates) == 1:
        return gates[0], credits
    return AllGates(gates), credits


def with_load(gate: Gate, load: InFlightLoad | None) -> Gate:
    """`gate`, and `load` told of every dispatch and completion beside it."""
    if load is None:
        return gate
    return AllGates((*gate_parts(gate), load))


def build_core(
    flow_control: FlowControlConfig,
    scheduling: SchedulingConfig,
    pool: Callable[[], PoolSnapshot],
    clock: Callable[[], float],
    rng: random.Random,
    on_flows_collected: Callable[[list[FlowKey]], None] | None = None,
    plugin_timer: PluginTimer | None = None,
) -> Core:
    """Gate, scheduler and flow controller for `flow_control` and
    `scheduling`, reading the pool from `pool` at the time `clock` gives;
    `plugin_timer` times the scheduler's plugin calls (`spec`)."""
    gate, credits = build_gate(flow_control.gate, pool, clock, scheduling.saturation)
    gate, prefill = stage_gate(gate, flow_control.gate.max_per_prefill_endpoint, scheduling)
    scheduler = Scheduler(scheduling, pool, clock, rng, credits, prefill, plugin_timer=plugin_timer)
    gate = with_load(gate, scheduler.load)
    controller = FlowController(flow_control, gate, scheduler, on_flows_collected)
    return Core(
        controller,
        gate,
        credits,
        scheduler,
        pool,
        clock,
        prefill,
        scheduler.load,
        plugin_timer,
        flow_control.gate.max_per_prefill_endpoint,
    )
