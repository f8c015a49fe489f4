"""Properties of the flow controller over random interleavings of enqueue,
dispatch, complete, cancel, expiry and idle collection.

The model keeps its own record of every request (its flow, its deadline, its
first outcome) and compares the controller with it after every step. Checks
made at the moment of each dispatch run inside the gate's `on_dispatch`,
where the dispatched request has just left its queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import inf

from flowcontrol_support import Credits
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from epp.flowcontrol.config import BandConfig, Fairness, FlowControlConfig, Ordering
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.gate import AllGates, ConcurrencyGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from tests.support.placers import LeastLoadedPlacer

ENDPOINTS = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
PRIORITIES = [-(2**31), -3, 0, 4]
TENANTS = ["a", "b", "c"]
IDLE_TIMEOUT = 4.0

ttls = st.one_of(st.none(), st.just(0.0), st.floats(0.5, 20.0))
NEW_REQUEST = {
    "fairness_id": st.sampled_from(TENANTS),
    "priority": st.sampled_from(PRIORITIES),
    "byte_size": st.integers(0, 50),
    "ttl": ttls,
    "ttft_slo": st.one_of(st.none(), st.floats(0.1, 30.0)),
    "input_tokens": st.integers(0, 100),
}
"""The fields of a new request, for the rules that make one."""
band_configs = st.builds(
    BandConfig,
    priority=st.just(0),
    max_requests=st.integers(0, 8),
    max_bytes=st.sampled_from([0, 60, 200]),
    ttl=ttls,
    fairness=st.sampled_from(list(Fairness)),
    ordering=st.sampled_from(list(Ordering)),
    input_weight=st.sampled_from([1.0, 0.5, 3.0]),
    output_weight=st.sampled_from([2.0, 1.0, 4.0]),
)


@dataclass
class Record:
    """What the model knows of one request."""

    request: FlowRequest
    index: int
    deadline: float
    order_key: float
    outcome: Outcome | None = None


@dataclass
class Period:
    """Two flows of one band continuously backlogged since the pair formed."""

    dispatches: dict[str, int] = field(default_factory=dict)


def positive_min(*ttls: float | None) -> float | None:
    limits = [t for t in ttls if t is not None and t > 0]
    return min(limits) if limits else None


class BlockingPlacer(LeastLoadedPlacer):
    """The least-loaded endpoint, except for blocked tenants, whose requests
    find no endpoint with room (as if their endpoint subset were full)."""

    def __init__(self, gate: ConcurrencyGate) -> None:
        super().__init__(lambda: ENDPOINTS, gate)
        self.blocked: set[str] = set()

    def place(self, request: FlowRequest):
        return None if request.fairness_id in self.blocked else super().place(request)


COMPLETION = {
    "data": st.data(),
    "usage": st.one_of(st.none(), st.builds(Usage, st.integers(0, 100), st.integers(0, 60))),
}
"""A completion rule's arguments: which running request, and its real usage."""


class FairShareTracking:
    """Tracks every pair of flows of a band while both stay backlogged: their
    dispatches under round-robin, and their VTC counters against 2U, U the
    most a flow can be charged for the requests it has in flight at once
    (bounded by the most requests a flow has had in flight at once times the
    largest single-request cost)."""

    core: FlowController
    config: FlowControlConfig
    serial: bool
    now: float

    def start_tracking(self) -> None:
        self.largest_cost: dict[int, float] = {}
        self.most_in_flight: dict[int, int] = {}
        self.periods: dict[tuple[int, str, str], Period] = {}

    def note_cost(self, priority: int, cost: float) -> None:
        self.largest_cost[priority] = max(self.largest_cost.get(priority, 0.0), cost)

    def count_dispatch(self, request: FlowRequest) -> None:
        config = self.config.band(request.priority)
        self.note_cost(request.priority, config.input_weight * request.input_tokens)
        flow = self.core.band(request.priority).flows[request.fairness_id]
        in_flight = flow.in_flight + (request.state is not State.DISPATCHED)
        most = self.most_in_flight
        most[request.priority] = max(most.get(request.priority, 0), in_flight)
        for (priority, first, second), period in self.periods.items():
            if priority == request.priority and request.fairness_id in (first, second):
                period.dispatches[request.fairness_id] += 1

    def count_completion(self, request: FlowRequest, usage: Usage | None) -> None:
        config = self.config.band(request.priority)
        if usage is None:
            cost = config.input_weight * request.input_tokens
        else:
            cost = config.input_weight * usage.input_tokens
            cost += config.output_weight * usage.output_tokens
        self.note_cost(request.priority, cost)

    def complete_one(self, data, requests: list[FlowRequest], usage: Usage | None) -> FlowRequest:
        """Complete one of the dispatched `requests`, drawn, with that usage."""
        running = [r for r in requests if r.state is State.DISPATCHED]
        request = data.draw(st.sampled_from(running))
        self.count_completion(request, usage)
        self.core.complete(request, self.now, usage)
        assert request.state is State.COMPLETED
        return request

    def check_fair_sharing(self) -> None:
        for band in self.core.bands():
            fairness = self.config.band(band.priority).fairness
            backlogged = {f for f, flow in band.flows.items() if flow.count}
            for first, second in _pairs(TENANTS):
                key = (band.priority, first, second)
                if first not in backlogged or second not in backlogged:
                    self.periods.pop(key, None)
                    continue
                period = self.periods.setdefault(key, Period({first: 0, second: 0}))
                if fairness is Fairness.ROUND_ROBIN:
                    turns = period.dispatches
                    assert abs(turns[first] - turns[second]) <= 1, turns
                if fairness is Fairness.VTC:
                    gap = abs(band.flows[first].counter - band.flows[second].counter)
                    in_flight = max(1, self.most_in_flight.get(band.priority, 0))
                    bound = 2 * in_flight * self.largest_cost.get(band.priority, 0.0)
                    assert gap <= bound, (gap, bound, in_flight)
        self.periods = {
            key: period for key, period in self.periods.items() if self.core.band(key[0])
        }


class FlowMachine(FairShareTracking, RuleBasedStateMachine):
    requests = Bundle("requests")

    @initialize(
        bands=st.lists(band_configs, min_size=len(PRIORITIES), max_size=len(PRIORITIES)),
        configured=st.sets(st.sampled_from(PRIORITIES)),
        max_requests=st.sampled_from([0, 6, 12]),
        max_bytes=st.sampled_from([0, 150, 400]),
        default_ttl=st.sampled_from([0.0, 5.0, 60.0]),
        serial=st.booleans(),
        per_endpoint=st.integers(0, 3),
    )
    def build(self, bands, configured, max_requests, max_bytes, default_ttl, serial, per_endpoint):
        by_priority = {
            p: BandConfig(**{**_fields(b), "priority": p})
            for p, b in zip(PRIORITIES, bands, strict=True)
        }
        default_band = by_priority.pop(PRIORITIES[-1])
        self.config = FlowControlConfig(
            max_requests=max_requests,
            max_bytes=max_bytes,
            default_ttl=default_ttl,
            default_band=default_band,
            bands=tuple(by_priority[p] for p in by_priority if p in configured),
            flow_idle_timeout=IDLE_TIMEOUT,
        )
        self.serial = serial
        self.pool_gate = ConcurrencyGate(
            max_in_flight=1 if serial else 0, max_per_endpoint=per_endpoint
        )
        self.credit_gate = Credits(0, observe=self.check_dispatch)
        self.placer = BlockingPlacer(self.pool_gate)
        self.core = FlowController(
            self.config, AllGates([self.credit_gate, self.pool_gate]), self.placer
        )
        self.now = 0.0
        self.records: dict[FlowRequest, Record] = {}
        self.start_tracking()

    # -- model -----------------------------------------------------------------

    def band_config(self, priority: int) -> BandConfig:
        return self.config.band(priority)

    def queued(self) -> list[Record]:
        return [rec for rec in self.records.values() if rec.request.state is State.QUEUED]

    def check_dispatch(self, request: FlowRequest) -> None:
        """Runs at the moment `request` is dispatched."""
        for band in self.core.bands():
            if band.priority > request.priority:
                assert band.count == 0, f"band {request.priority} overtook band {band.priority}"
        config = self.band_config(request.priority)
        mine = self.records[request]
        same_queue = [
            rec
            for rec in self.queued()
            if rec.request.priority == request.priority
            and (
                config.fairness is Fairness.GLOBAL_STRICT
                or rec.request.fairness_id == request.fairness_id
            )
        ]
        if config.ordering is Ordering.FCFS:
            earlier = [rec for rec in same_queue if rec.index < mine.index]
        else:
            earlier = [
                rec
                for rec in same_queue
                if (rec.order_key, rec.index) < (mine.order_key, mine.index)
            ]
        assert not earlier, f"{request.request_id} went before {earlier[0].request.request_id}"
        self.count_dispatch(request)

    # -- rules -----------------------------------------------------------------

    @rule(target=requests, **NEW_REQUEST)
    def enqueue(self, fairness_id, priority, byte_size, ttl, ttft_slo, input_tokens):
        request, full = self.new_request(
            fairness_id, priority, byte_size, ttl, ttft_slo, input_tokens
        )
        outcome = self.core.enqueue(request, self.now)
        assert outcome is (Outcome.REJECTED_SATURATED if full else None)
        return request

    @rule(target=requests, credits=st.integers(0, 6), **NEW_REQUEST)
    def enqueue_and_dispatch(
        self, fairness_id, priority, byte_size, ttl, ttft_slo, input_tokens, credits
    ):
        request, full = self.new_request(
            fairness_id, priority, byte_size, ttl, ttft_slo, input_tokens
        )
        self.credit_gate.credits = credits
        outcome, dispatched = self.core.enqueue_and_dispatch(request, self.now)
        assert outcome is (Outcome.REJECTED_SATURATED if full else None)
        assert not (full and dispatched)
        assert all(r.outcome is Outcome.DISPATCHED and r.endpoint in ENDPOINTS for r in dispatched)
        return request

    def new_request(self, fairness_id, priority, byte_size, ttl, ttft_slo, input_tokens):
        """A request the model records, and whether its band or the
        controller is too full to take it."""
        index = len(self.records)
        request = FlowRequest(
            request_id=f"r{index}",
            fairness_id=fairness_id,
            priority=priority,
            arrival=self.now,
            byte_size=byte_size,
            input_tokens=input_tokens,
            ttl=ttl,
            ttft_slo=ttft_slo,
        )
        config = self.band_config(priority)
        band = self.core.band(priority)
        band_count, band_bytes = (band.count, band.bytes) if band else (0, 0)
        full = (
            _over(band_count + 1, config.max_requests)
            or _over(band_bytes + byte_size, config.max_bytes)
            or _over(self.core.queued_requests + 1, self.config.max_requests)
            or _over(self.core.queued_bytes + byte_size, self.config.max_bytes)
        )
        ttl_limit = positive_min(self.config.default_ttl, config.ttl, ttl)
        deadline = inf if ttl_limit is None else self.now + ttl_limit
        order_key = (
            self.now + ttft_slo
            if config.ordering is Ordering.SLO_DEADLINE and ttft_slo is not None
            else deadline
        )
        self.records[request] = Record(request, index, deadline, order_key)
        return request, full

    @rule(credits=st.integers(0, 6))
    def dispatch(self, credits):
        self.credit_gate.credits = credits
        dispatched = self.core.dispatch(self.now)
        assert all(r.outcome is Outcome.DISPATCHED and r.endpoint in ENDPOINTS for r in dispatched)
        bands = [band for band in self.core.bands() if band.count]
        room = any(self.pool_gate.has_room(e) for e in ENDPOINTS)
        if bands and self.credit_gate.credits > 0 and self.pool_gate.is_open(0) and room:
            top = bands[0].priority
            assert any(
                rec.request.priority == top and rec.request.fairness_id in self.placer.blocked
                for rec in self.queued()
            ), "dispatch stopped while the gate was open and the top band had a placeable request"

    @rule(fairness_id=st.sampled_from(TENANTS))
    def toggle_blocked(self, fairness_id):
        self.placer.blocked ^= {fairness_id}

    @precondition(lambda self: self.core.in_flight)
    @rule(**COMPLETION)
    def complete(self, data, usage):
        request = self.complete_one(data, list(self.records), usage)
        assert self.core.complete(request, self.now, usage) == []

    @rule(request=consumes(requests))
    def cancel(self, request):
        was_queued = request.state is State.QUEUED
        settled = self.core.cancel(request, self.now)
        assert (settled[:1] == [request]) is was_queued
        if was_queued:
            assert request.outcome is Outcome.CANCELLED

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, 3.0, 7.5]))
    def advance_and_expire(self, dt):
        self.now += dt
        due = {rec.request for rec in self.queued() if rec.deadline <= self.now}
        settled = self.core.expire(self.now)
        expired, dispatched = settled[: len(due)], settled[len(due) :]
        assert set(expired) == due and len(expired) == len(due)
        assert all(r.outcome is Outcome.REJECTED_TTL_EXPIRED for r in expired)
        assert all(r.outcome is Outcome.DISPATCHED for r in dispatched)
        next_deadline = self.core.next_deadline()
        expected = min((rec.deadline for rec in self.queued()), default=inf)
        assert (inf if next_deadline is None else next_deadline) == expected

    @rule()
    def poke(self):
        collected: list = []
        self.core.on_flows_collected = collected.extend
        self.core.poke(self.now)
        for key in collected:
            assert not any(
                rec.request.state in (State.QUEUED, State.DISPATCHED)
                and (rec.request.fairness_id, rec.request.priority) == key
                for rec in self.records.values()
            )

    # -- invariants ------------------------------------------------------------

    @invariant()
    def capacity_is_never_exceeded(self):
        core = self.core
        assert not _over(core.queued_requests, self.config.max_requests)
        assert not _over(core.queued_bytes, self.config.max_bytes)
        for band in core.bands():
            config = self.band_config(band.priority)
            assert not _over(band.count, config.max_requests)
            assert not _over(band.bytes, config.max_bytes)

    @invariant()
    def counts_match_the_requests_states(self):
        core = self.core
        queued = self.queued()
        running = [r for r in self.records if r.state is State.DISPATCHED]
        assert core.queued_requests == len(queued) == sum(b.count for b in core.bands())
        assert core.queued_bytes == sum(rec.request.byte_size for rec in queued)
        assert core.queued_bytes == sum(b.bytes for b in core.bands())
        for band in core.bands():
            assert band.count == sum(flow.count for flow in band.flows.values())
            for fairness_id, flow in band.flows.items():
                mine = [
                    rec
                    for rec in queued
                    if (rec.request.fairness_id, rec.request.priority)
                    == (fairness_id, band.priority)
                ]
                assert flow.count == len(mine)
        assert core.in_flight == len(running) == self.pool_gate.in_flight
        for endpoint in ENDPOINTS:
            on_it = sum(1 for r in running if r.endpoint == endpoint)
            assert self.pool_gate.in_flight_at(endpoint) == on_it

    @invariant()
    def every_outcome_is_final(self):
        for request, rec in self.records.items():
            if rec.outcome is None:
                rec.outcome = request.outcome
            assert request.outcome is rec.outcome
            if request.state in (State.NEW, State.QUEUED):
                assert request.outcome is None
            elif request.state is State.DROPPED:
                assert request.outcome not in (None, Outcome.DISPATCHED)
            else:
                assert request.outcome is Outcome.DISPATCHED

    @invariant()
    def backlogged_flows_share_fairly(self):
        self.check_fair_sharing()

    def teardown(self):
        if not hasattr(self, "core"):
            return
        core = self.core
        self.credit_gate.credits = inf
        self.placer.blocked.clear()
        core.dispatch(self.now)
        for _ in range(len(self.records) + 1):
            running = [r for r in self.records if r.state is State.DISPATCHED]
            if not running:
                break
            for request in running:
                core.complete(request, self.now)  # dispatches what is queued
        assert (core.queued_requests, core.queued_bytes, core.in_flight) == (0, 0, 0)
        assert self.pool_gate.in_flight == 0
        assert all(rec.request.outcome is not None for rec in self.records.values())
        core.poke(self.now + IDLE_TIMEOUT)
        assert all(not band.flows for band in core.bands())


def _fields(config: BandConfig) -> dict:
    return {name: getattr(config, name) for name in BandConfig.__slots__}


def _over(value: float, limit: int) -> bool:
    return limit > 0 and value > limit


def _pairs(items: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(items) for b in items[i + 1 :]]


class FairShareMachine(FairShareTracking, RuleBasedStateMachine):
    """One band under round-robin or vtc, tenants arriving in bursts and
    leaving, requests completing with random usage: the fairness bounds."""

    @initialize(
        fairness=st.sampled_from([Fairness.ROUND_ROBIN, Fairness.VTC]),
        input_weight=st.sampled_from([1.0, 0.5, 3.0]),
        output_weight=st.sampled_from([2.0, 0.0, 4.0]),
        serial=st.booleans(),
        max_in_flight=st.sampled_from([0, 2, 4]),
    )
    def build(self, fairness, input_weight, output_weight, serial, max_in_flight):
        band = BandConfig(
            priority=0,
            max_requests=0,
            max_bytes=0,
            fairness=fairness,
            input_weight=input_weight,
            output_weight=output_weight,
        )
        self.config = FlowControlConfig(default_ttl=0.0, bands=(band,))
        self.serial = serial
        self.pool_gate = ConcurrencyGate(max_in_flight=1 if serial else max_in_flight)
        self.credit_gate = Credits(0, observe=self.count_dispatch)
        self.core = FlowController(
            self.config,
            AllGates([self.credit_gate, self.pool_gate]),
            LeastLoadedPlacer(lambda: ENDPOINTS, self.pool_gate),
        )
        self.now = 0.0
        self.all: list[FlowRequest] = []
        self.start_tracking()

    @rule(
        fairness_id=st.sampled_from(TENANTS),
        burst=st.integers(1, 4),
        input_tokens=st.integers(1, 100),
    )
    def enqueue(self, fairness_id, burst, input_tokens):
        for _ in range(burst):
            request = FlowRequest(
                f"r{len(self.all)}", fairness_id, 0, self.now, input_tokens=input_tokens
            )
            self.all.append(request)
            assert self.core.enqueue(request, self.now) is None

    @rule(credits=st.integers(1, 3))
    def dispatch(self, credits):
        self.credit_gate.credits = credits
        self.core.dispatch(self.now)

    @rule(rounds=st.integers(1, 6), output_tokens=st.integers(0, 60))
    def serve_one_at_a_time(self, rounds, output_tokens):
        """Dispatch one request and complete it at once, `rounds` times."""
        for _ in range(rounds):
            self.credit_gate.credits = 1
            for request in self.core.dispatch(self.now):
                usage = Usage(request.input_tokens, output_tokens)
                self.count_completion(request, usage)
                self.core.complete(request, self.now, usage)
                assert request.state is State.COMPLETED
            self.check_fair_sharing()

    @precondition(lambda self: self.core.in_flight)
    @rule(**COMPLETION)
    def complete(self, data, usage):
        self.complete_one(data, self.all, usage)

    @precondition(lambda self: self.core.queued_requests)
    @rule(data=st.data())
    def cancel(self, data):
        queued = [r for r in self.all if r.state is State.QUEUED]
        assert self.core.cancel(data.draw(st.sampled_from(queued)), self.now)

    @invariant()
    def backlogged_flows_share_fairly(self):
        self.check_fair_sharing()


PROPERTY_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
FlowMachine.TestCase.settings = PROPERTY_SETTINGS
FairShareMachine.TestCase.settings = settings(PROPERTY_SETTINGS, max_examples=300)
test_flow_controller_properties = FlowMachine.TestCase
test_fair_sharing_bounds = FairShareMachine.TestCase
