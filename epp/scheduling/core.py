"""The core: the one object a shell holds, and the one place that wires
gate, scheduler and flow controller, for the live EPP (`epp.serve`) and the
simulator (`epp.sim.policies`) alike.

    pool snapshot --> gate (build_gate) --credits--> Scheduler (the placer)
                          \\                            /
                           +---> FlowController <-----+
                                       ^
    shell --every signal--> Core ------+  (evictor, prefill deadlines, admitters)

Both shells read the pool through an `EndpointStore`'s `snapshot` and pass
their own clock (monotonic live, virtual in the simulator) and random source.

Every signal goes in through `Core`: an arrival (`arrive`, after `screen`
asks the admitters), a completion with its usage and streamed latency
(`complete`), a first token (`first_token`), the end of a prefill
(`prefill_done`), a cancel, a reload, and `poke` for anything else that may
free room (new metrics, new endpoints, the wakeup it asked for). Each
forwards what the gate and the credits must learn, dispatches as much as
possible and returns the requests it settled (dispatched with `endpoint`
set, or ended with `outcome` set); `next_wakeup()` is the one time to call
`poke` again. No shell tells a gate anything or decides when to dispatch.
The servers' KV-cache events (`kv_events`, `kv_endpoint_reset`) go in
through it too, to the precise prefix index the scorers read; they free no
room and dispatch nothing.

Two things live here around the flow controller, both off unless configured:

- eviction (`flowControl.enableEviction`, `epp.flowcontrol.eviction`):
  after a call that leaves a band waiting, the `Evictor` may name one
  dispatched sheddable victim, which the core hands to `on_evict`; the
  shell ends it (429 `evicted`) and completes it as any other request, so
  its credit returns exactly once;
- the prefill deadline (`flowControl.gate.prefillTimeout`): a request
  dispatched through a prefill endpoint gives its prefill credit back at
  `prefill_done`, or `prefill_timeout` after its dispatch, or when it ends.
  The requests in their prefill stage are kept in dispatch order, and all
  share one timeout, so the oldest is the next deadline: O(1) per dispatch,
  per `prefill_done` and per expiry, at most one entry per prefill credit.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.band import Band
from epp.flowcontrol.config import FlowControlConfig, GateConfig, GateKind
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import Evictor, PriorityThenTime, SheddableFilter
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import (
    AllGates,
    ConcurrencyGate,
    Credits,
    Gate,
    OpenGate,
    Placer,
    gate_parts,
)
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.admitters import ProbabilisticAdmitter
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.detectors import DetectorGate
from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.kvblocks import KVBlockIndex, KVEvent
from epp.scheduling.saturation import (
    DEFAULT_THRESHOLDS,
    SaturationThresholds,
    UtilizationGate,
    gate_saturation,
)
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.spec import PluginTimer
from epp.scheduling.stages import PrefillCredits, stage_gate

PlacerTimer = Callable[[Placer], Placer]
"""Wraps the scheduler the flow controller places with (to time each
`place`); applied again to the scheduler of every reload."""

EMPTY_POOL = PoolSnapshot(())


def _no_pool() -> PoolSnapshot:
    return EMPTY_POOL


def _no_clock() -> float:
    return 0.0


@dataclass(slots=True)
class Core:
    """The core a shell holds (see the module docstring). `credits` is the
    gate's per-endpoint part (adaptive or concurrency; None when the
    configured gate has neither), shared with the scheduler. Built by
    `build_core`; a test or benchmark may wrap a hand-built controller
    (`Core(controller)`)."""

    controller: FlowController
    credits: Credits | None = None
    scheduler: Scheduler | None = None
    pool: Callable[[], PoolSnapshot] = _no_pool
    clock: Callable[[], float] = _no_clock
    prefill_credits: PrefillCredits | None = None
    """The prefill stage's credits under P/D (`epp.scheduling.stages`)."""
    load: InFlightLoad | None = None
    """What is in flight per endpoint, when a scheduling plugin reads it."""
    plugin_timer: PluginTimer | None = None
    placer_timer: PlacerTimer | None = None
    max_per_prefill_endpoint: int = 0
    """The prefill credits per prefill endpoint a disaggregating reload gets."""
    prefill_timeout: float = 60.0
    """Seconds a request keeps its prefill credit without `prefill_done`."""
    evictor: Evictor | None = None
    admitters: Sequence[ProbabilisticAdmitter] = ()
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    """The admitters' draws."""
    on_evict: Callable[[FlowRequest], None] | None = None
    """Ends an evicted request's stream; the shell completes it after."""
    kv_index: KVBlockIndex | None = None
    """The precise prefix index, when a scorer reads it: kept across reloads,
    fed with the servers' KV-cache events (`kv_events`)."""
    adaptive: AdaptiveGate | None = field(default=None, init=False)
    """The credits when they are the adaptive gate's (limits, latency, first tokens)."""
    _prefill_since: dict[FlowRequest, float] = field(default_factory=dict, init=False)
    """Requests holding a prefill credit, by dispatch time, oldest first."""
    _watch: bool = field(default=False, init=False)
    """Whether settled requests need looking at (eviction or prefill timing)."""
    arrive: Callable[[FlowRequest, float], tuple[Outcome | None, list[FlowRequest]]] = field(
        init=False
    )
    """A new request: the outcome that ended it at once (rejected), else
    None and what the dispatch pass settled (`request` among them when it
    was dispatched at once). The controller's own call when the core has
    nothing to add (no eviction, no prefill stage): one call less per arrival."""
    next_wakeup: Callable[[], float | None] = field(init=False)
    """When `poke` next has something to do by itself, or None. The
    controller's own when no prefill stage is timed."""

    def __post_init__(self) -> None:
        if isinstance(self.credits, AdaptiveGate):
            self.adaptive = self.credits
        self._rewatch()

    def _rewatch(self) -> None:
        self._watch = self.evictor is not None or self.prefill_credits is not None
        controller = self.controller
        self.arrive = self._arrive_watched if self._watch else controller.enqueue_and_dispatch
        self.next_wakeup = (
            controller.next_wakeup if self.prefill_credits is None else self._next_wakeup_timed
        )

    @property
    def gate(self) -> Gate:
        return self.controller.gate

    @property
    def queued_requests(self) -> int:
        return self.controller.queued_requests

    @property
    def in_flight(self) -> int:
        return self.controller.in_flight

    @property
    def in_prefill(self) -> int:
        """Requests holding a prefill credit whose deadline the core keeps."""
        return len(self._prefill_since)

    # -- the signals -----------------------------------------------------------

    def screen(self, request: FlowRequest, now: float) -> str | None:
        """The configured admitters' refusal of `request` before it is
        offered (None: it may `arrive`), in declaration order."""
        admitters = self.admitters
        if not admitters:
            return None
        pool = self.pool()
        for admitter in admitters:
            denial = admitter.deny(request.priority, pool, now, self.rng.random())
            if denial is not None:
                return denial
        return None

    def _arrive_watched(
        self, request: FlowRequest, now: float
    ) -> tuple[Outcome | None, list[FlowRequest]]:
        """`arrive` when settled requests need looking at."""
        result = self.controller.enqueue_and_dispatch(request, now)
        self._after(result[1], now)
        return result

    def complete(
        self, request: FlowRequest, now: float, usage: Usage | None = None, itl: float | None = None
    ) -> list[FlowRequest]:
        """A dispatched request is over: `itl`, its streamed response's
        seconds per output token after the first (None: not measured), goes
        to the adaptive gate first; then its credits return and its fairness
        charge is corrected to the real `usage` (None: not reported). Nothing
        when it was not in flight."""
        if itl is not None and self.adaptive is not None:
            self.adaptive.observe_latency(request, itl)
        if self._watch:
            if self._prefill_since:
                self._prefill_since.pop(request, None)
            if self.evictor is not None:
                self.evictor.on_completed(request)
            settled = self.controller.complete(request, now, usage)
            self._after(settled, now)
            return settled
        return self.controller.complete(request, now, usage)

    def adopt(self, request: FlowRequest, endpoint: str, now: float) -> None:
        """`request` already runs at `endpoint`, placed by an earlier decider:
        it holds its credit here from now until `complete` (a new decider
        rebuilding what is in flight from its replicas' reports)."""
        self.controller.adopt(request, endpoint, now)
        if self._watch:
            self._after([request], now)

    def first_token(self, request: FlowRequest, now: float) -> list[FlowRequest]:
        """A streamed response's first token reached the EPP: its server runs
        the request. The room that may make is for queued requests only."""
        if self.load is not None:
            self.load.on_first_token(request)
        adaptive = self.adaptive
        if adaptive is None or not adaptive.on_first_token(request):
            return []
        return self.poke(now) if self.controller.queued_requests else []

    def prefill_done(self, request: FlowRequest, now: float) -> list[FlowRequest]:
        """`request`'s prefill is over (its decode response began): its
        prefill credit returns."""
        credits = self.prefill_credits
        if credits is None:
            return []
        self._prefill_since.pop(request, None)
        return self.poke(now) if credits.release(request) else []

    def cancel(self, request: FlowRequest, now: float) -> list[FlowRequest]:
        """A queued request's client is gone: `request` (cancelled), then
        what its leaving let through; nothing when it was not queued."""
        settled = self.controller.cancel(request, now)
        if self._watch:
            self._after(settled, now)
        return settled

    def kv_events(self, address: str, events: Iterable[KVEvent]) -> None:
        """The endpoint at `address` published `events` (in its order); without
        a precise index they are dropped."""
        if self.kv_index is not None:
            self.kv_index.apply(address, events)

    def kv_endpoint_reset(self, address: str) -> None:
        """The endpoint at `address` restarted or lost events it cannot
        replay: it holds nothing now (what it held is kept as its former
        keys, `KVBlockIndex.clear_endpoint`)."""
        if self.kv_index is not None:
            self.kv_index.clear_endpoint(address)

    def poke(self, now: float) -> list[FlowRequest]:
        """Do what is due by `now` (TTL expiries, prefill deadlines, idle
        flows) and dispatch as much as possible."""
        if self._prefill_since:
            self._expire_prefills(now)
        settled = self.controller.poke(now)
        if self._watch:
            self._after(settled, now)
        return settled

    def _next_wakeup_timed(self) -> float | None:
        """`next_wakeup` with the prefill deadlines."""
        when = self.controller.next_wakeup()
        if self._prefill_since:
            deadline = next(iter(self._prefill_since.values())) + self.prefill_timeout
            if when is None or deadline < when:
                return deadline
        return when

    def reload(
        self,
        flow_control: FlowControlConfig,
        now: float,
        scheduling: SchedulingConfig | None = None,
        rng: random.Random | None = None,
        admitters: Sequence[ProbabilisticAdmitter] | None = None,
    ) -> list[FlowRequest]:
        """New flow-control limits and policies, the prefill timeout, and
        when given a new scheduling (placed with a scheduler drawing from
        `rng`) and new admitters; queued requests stay queued and nothing
        in flight is lost. The gate's kinds stay. Returns what the dispatch
        pass that follows settled."""
        if scheduling is not None:
            self.reschedule(scheduling, rng or random.Random(0))
        if admitters is not None:
            self.admitters = tuple(admitters)
        self.prefill_timeout = flow_control.gate.prefill_timeout
        settled = self.controller.reconfigure(flow_control, now)
        if self._watch:
            self._after(settled, now)
        return settled

    # -- state the shells read ---------------------------------------------------

    def ensure_bands(self, priorities: Iterable[int]) -> None:
        """Make sure these bands exist (the priorities of the known objectives)."""
        self.controller.ensure_bands(priorities)

    def watch_flows(self, callback: Callable[[list[FlowKey]], None] | None) -> None:
        """Tell `callback` of the flows `poke` forgets as idle."""
        self.controller.on_flows_collected = callback

    def bands(self) -> list[Band]:
        return self.controller.bands()

    def close(self) -> None:
        """Admit nothing more: every later arrival is rejected-shutting-down."""
        self.controller.close()

    def drain(self, outcome: Outcome, now: float) -> list[FlowRequest]:
        """End every queued request with `outcome` (at shutdown)."""
        return self.controller.drain(outcome, now)

    def saturation(self) -> float:
        """The pool's saturation as the gate sees it now (the gauge's value)."""
        return gate_saturation(self.gate, self.pool())

    def limits(self) -> dict[str, int]:
        """The adaptive gate's learned limit per endpoint ({}: no adaptive gate)."""
        return self.adaptive.limits() if self.adaptive is not None else {}

    def seed_limits(self, limits: Mapping[str, int], now: float) -> list[FlowRequest]:
        """Learned limits from another decider of the pool (a new decider
        rebuilding soft state): the adaptive gate starts each endpoint from
        them; then what the room they may make lets through. Nothing
        without an adaptive gate."""
        if self.adaptive is None:
            return []
        self.adaptive.seed(limits)
        return self.poke(now)

    # -- reloading the scheduler ---------------------------------------------------

    def reschedule(self, config: SchedulingConfig, rng: random.Random) -> Scheduler:
        """Place later requests with a scheduler built from `config` (a
        reload), and read utilization against its saturation thresholds; the
        gate and its credits stay, so nothing in flight is lost. A reload
        that first names a plugin reading the in-flight load counts from
        then on; one that first disaggregates gets the prefill stage's
        credits from then on (they stay if a later reload stops)."""
        controller = self.controller
        if self.prefill_credits is None:
            gate, prefill = stage_gate(controller.gate, self.max_per_prefill_endpoint, config)
            if prefill is not None:
                controller.gate = gate
                self.prefill_credits = prefill
                self._rewatch()
        if config.precise is not None and self.kv_index is not None:
            config.precise.retune(self.kv_index)
        scheduler = self.scheduler = Scheduler(
            config,
            self.pool,
            self.clock,
            rng,
            self.credits,
            self.prefill_credits,
            self.load,
            self.plugin_timer,
            self.kv_index,
        )
        if self.kv_index is None:
            self.kv_index = scheduler.kv_index
        if self.load is None and scheduler.load is not None:
            self.load = scheduler.load
            controller.gate = with_load(controller.gate, self.load)
        controller.placer = self.placer_timer(scheduler) if self.placer_timer else scheduler
        for part in gate_parts(controller.gate):
            if isinstance(part, UtilizationGate):
                part.retune(config.saturation)
        return scheduler

    # -- internals ---------------------------------------------------------------

    def _after(self, settled: list[FlowRequest], now: float) -> None:
        """Note the dispatched among `settled` (their prefill deadline, the
        evictor's candidates); then, if a band still waits, evict for it."""
        evictor = self.evictor
        timed = self.prefill_credits
        for request in settled:
            if request.endpoint is None:
                continue
            if evictor is not None:
                evictor.on_dispatched(request)
            if timed is not None and timed.holds(request):
                self._prefill_since[request] = now
        if evictor is not None and self.controller.queued_requests:
            waiting = next((band for band in self.controller.bands() if band.count), None)
            victim = evictor.victim_for(waiting.priority) if waiting is not None else None
            if victim is not None and self.on_evict is not None:
                self.on_evict(victim)

    def _expire_prefills(self, now: float) -> None:
        """Return the prefill credits of requests whose prefill outlived the timeout."""
        since = self._prefill_since
        credits = self.prefill_credits
        timeout = self.prefill_timeout
        while since:
            request, at = next(iter(since.items()))
            if at + timeout > now:
                return
            del since[request]
            if credits is not None:
                credits.release(request)


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
    placer_timer: PlacerTimer | None = None,
    eviction: tuple[SheddableFilter, PriorityThenTime] | None = None,
    admitters: Sequence[ProbabilisticAdmitter] = (),
    admission_rng: random.Random | None = None,
) -> Core:
    """The core for `flow_control` and `scheduling`, reading the pool from
    `pool` at the time `clock` gives: gate, scheduler (drawing from `rng`)
    and flow controller; `plugin_timer` times the scheduler's plugin calls
    (`spec`), `placer_timer` wraps the scheduler the controller places with
    (here and after every reload); `eviction` is the configured eviction
    filter and order (`enableEviction`), `admitters` the admitter plugins, drawing from
    `admission_rng`."""
    gate, credits = build_gate(flow_control.gate, pool, clock, scheduling.saturation)
    gate, prefill = stage_gate(gate, flow_control.gate.max_per_prefill_endpoint, scheduling)
    scheduler = Scheduler(scheduling, pool, clock, rng, credits, prefill, plugin_timer=plugin_timer)
    gate = with_load(gate, scheduler.load)
    placer = placer_timer(scheduler) if placer_timer is not None else scheduler
    controller = FlowController(flow_control, gate, placer, on_flows_collected)
    return Core(
        controller,
        credits,
        scheduler,
        pool,
        clock,
        prefill,
        scheduler.load,
        plugin_timer,
        placer_timer,
        flow_control.gate.max_per_prefill_endpoint,
        flow_control.gate.prefill_timeout,
        Evictor(*eviction) if eviction is not None else None,
        tuple(admitters),
        admission_rng or random.Random(0),
        kv_index=scheduler.kv_index,
    )
