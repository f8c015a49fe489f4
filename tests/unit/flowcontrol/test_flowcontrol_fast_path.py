"""`enqueue_and_dispatch` against `enqueue` then `dispatch`.

Two controllers with the same configuration see the same random interleaving
of arrivals, dispatch passes, completions, cancellations, expiry, idle
collection and placer moods; one takes arrivals through `enqueue` and
`dispatch`, the other through `enqueue_and_dispatch`, which skips the queues
when nothing is queued. After every step both must have decided the same
outcomes in the same order and hold the same counts and fairness counters.
"""

from __future__ import annotations

from flowcontrol_support import Credits
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from epp.flowcontrol.config import BandConfig, Fairness, FlowControlConfig, Ordering
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.gate import AllGates, ConcurrencyGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from tests.support.placers import LeastLoadedPlacer

ENDPOINTS = ["10.0.0.1:8000", "10.0.0.2:8000"]
PRIORITIES = [-1, 0, 3]
TENANTS = ["a", "b", "c"]
IDLE_TIMEOUT = 2.0

band_configs = st.builds(
    BandConfig,
    priority=st.just(0),
    max_requests=st.sampled_from([0, 1, 4]),
    max_bytes=st.sampled_from([0, 30, 120]),
    ttl=st.sampled_from([None, 0.0, 1.0, 6.0]),
    fairness=st.sampled_from(list(Fairness)),
    ordering=st.sampled_from(list(Ordering)),
    input_weight=st.sampled_from([1.0, 0.5]),
    output_weight=st.sampled_from([2.0, 0.0]),
)


class MoodyPlacer(LeastLoadedPlacer):
    """Least loaded, except that tenants in `waiting` find no room and
    tenants in `refused` are ended at once."""

    def __init__(self, gate: ConcurrencyGate) -> None:
        super().__init__(lambda: ENDPOINTS, gate)
        self.waiting: set[str] = set()
        self.refused: set[str] = set()
        self.asked: list[str] = []

    def place(self, request: FlowRequest):
        self.asked.append(request.request_id)
        if request.fairness_id in self.refused:
            return Outcome.REJECTED_NO_ENDPOINTS
        if request.fairness_id in self.waiting:
            return None
        return super().place(request)


class Side:
    """One controller with its gates, placer and requests."""

    def __init__(self, config: FlowControlConfig, max_in_flight: int, per_endpoint: int) -> None:
        self.credit_gate = Credits(0)
        self.pool_gate = ConcurrencyGate(max_in_flight, per_endpoint)
        self.placer = MoodyPlacer(self.pool_gate)
        self.core = FlowController(
            config, AllGates([self.credit_gate, self.pool_gate]), self.placer
        )
        self.requests: list[FlowRequest] = []
        self.decided: list[tuple[str, Outcome, str | None]] = []

    def note(self, done: list[FlowRequest]) -> None:
        self.decided.extend((r.request_id, r.outcome, r.endpoint) for r in done)

    def state(self) -> tuple:
        core = self.core
        bands = [
            (
                band.priority,
                band.count,
                band.bytes,
                sorted(
                    (f.fairness_id, f.count, f.in_flight, f.counter) for f in band.flows.values()
                ),
                [r.request_id for r in band.policy.requests()],
            )
            for band in core.bands()
        ]
        requests = [
            (r.state, r.outcome, r.endpoint, r.seq, r.deadline, r.charged_input)
            for r in self.requests
        ]
        return (
            core.queued_requests,
            core.queued_bytes,
            core.in_flight,
            core.next_wakeup(),
            bands,
            requests,
            self.decided,
            [r.request_id for r in self.credit_gate.dispatched],
            [r.request_id for r in self.credit_gate.completed],
            self.placer.asked,
            self.pool_gate.in_flight,
        )


class FastPathMachine(RuleBasedStateMachine):
    @initialize(
        bands=st.lists(band_configs, min_size=len(PRIORITIES), max_size=len(PRIORITIES)),
        max_requests=st.sampled_from([0, 3, 8]),
        max_bytes=st.sampled_from([0, 40, 200]),
        default_ttl=st.sampled_from([0.0, 3.0]),
        max_in_flight=st.sampled_from([0, 1, 3]),
        per_endpoint=st.sampled_from([0, 1, 2]),
    )
    def build(self, bands, max_requests, max_bytes, default_ttl, max_in_flight, per_endpoint):
        configured = [
            BandConfig(**{**_fields(b), "priority": p})
            for p, b in zip(PRIORITIES, bands, strict=True)
        ]
        config = FlowControlConfig(
            max_requests=max_requests,
            max_bytes=max_bytes,
            default_ttl=default_ttl,
            default_band=configured[-1],
            bands=tuple(configured[:-1]),
            flow_idle_timeout=IDLE_TIMEOUT,
        )
        self.slow = Side(config, max_in_flight, per_endpoint)
        self.fast = Side(config, max_in_flight, per_endpoint)
        self.now = 0.0

    def sides(self) -> tuple[Side, Side]:
        return self.slow, self.fast

    @rule(
        fairness_id=st.sampled_from(TENANTS),
        priority=st.sampled_from(PRIORITIES),
        byte_size=st.integers(0, 50),
        input_tokens=st.integers(0, 100),
        ttl=st.sampled_from([None, 0.0, 0.5, 4.0]),
        ttft_slo=st.sampled_from([None, 0.2, 5.0]),
        credits=st.integers(0, 3),
    )
    def arrive(self, fairness_id, priority, byte_size, input_tokens, ttl, ttft_slo, credits):
        results = []
        for side in self.sides():
            request = FlowRequest(
                f"r{len(side.requests)}",
                fairness_id,
                priority,
                self.now,
                byte_size,
                input_tokens,
                ttl,
                ttft_slo,
            )
            side.requests.append(request)
            side.credit_gate.credits = credits
            if side is self.slow:
                outcome = side.core.enqueue(request, self.now)
                done = [] if outcome is not None else side.core.dispatch(self.now)
            else:
                outcome, done = side.core.enqueue_and_dispatch(request, self.now)
            side.note(done)
            results.append((outcome, [r.request_id for r in done]))
        assert results[0] == results[1]

    @rule(credits=st.integers(0, 4))
    def dispatch(self, credits):
        for side in self.sides():
            side.credit_gate.credits = credits
            side.note(side.core.dispatch(self.now))

    @rule(
        fairness_id=st.sampled_from(TENANTS),
        mood=st.sampled_from(["waiting", "refused", "placed"]),
    )
    def set_placer_mood(self, fairness_id, mood):
        for side in self.sides():
            side.placer.waiting.discard(fairness_id)
            side.placer.refused.discard(fairness_id)
            if mood != "placed":
                getattr(side.placer, mood).add(fairness_id)

    @precondition(lambda self: self.slow.core.in_flight)
    @rule(
        data=st.data(),
        usage=st.one_of(st.none(), st.builds(Usage, st.integers(0, 100), st.integers(0, 40))),
    )
    def complete(self, data, usage):
        running = [i for i, r in enumerate(self.slow.requests) if r.state is State.DISPATCHED]
        index = data.draw(st.sampled_from(running))
        for side in self.sides():
            request = side.requests[index]
            side.note(side.core.complete(request, self.now, usage))
            assert request.state is State.COMPLETED

    @precondition(lambda self: self.slow.core.queued_requests)
    @rule(data=st.data())
    def cancel(self, data):
        queued = [i for i, r in enumerate(self.slow.requests) if r.state is State.QUEUED]
        index = data.draw(st.sampled_from(queued))
        for side in self.sides():
            settled = side.core.cancel(side.requests[index], self.now)
            assert settled[0] is side.requests[index]
            side.note(settled)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5]))
    def advance(self, dt):
        self.now += dt
        collected = []
        for side in self.sides():
            keys: list = []
            side.core.on_flows_collected = keys.extend
            side.note(side.core.poke(self.now))
            collected.append(keys)
        assert collected[0] == collected[1]

    @invariant()
    def both_sides_agree(self):
        if hasattr(self, "slow"):
            assert self.slow.state() == self.fast.state()


def test_vtc_lift_counts_a_flow_s_entry_left_by_a_discard_as_push_does():
    """A flow whose queued request was cancelled keeps its heap entry; `push`
    sees it as backlogged again when the flow's next request arrives, and
    lifts the flow to that entry's counter. The direct dispatch must too."""
    counters = []
    for fast in (False, True):
        config = FlowControlConfig(
            default_ttl=0.0, bands=(BandConfig(priority=0, fairness=Fairness.VTC),)
        )
        side = Side(config, max_in_flight=0, per_endpoint=0)
        core = side.core
        side.credit_gate.credits = 1
        first = _arrive(side, 100, fast)  # dispatched: counter 100
        second = _arrive(side, 10, fast)  # queued behind the closed gate, at counter 100
        core.cancel(second, 0.0)
        core.complete(first, 0.0, Usage(0, 0))  # real input 0: counter back to 0
        side.credit_gate.credits = 1
        _arrive(side, 10, fast)
        counters.append(core.band(0).flows["a"].counter)
    assert counters == [110.0, 110.0]


def _arrive(side: Side, input_tokens: int, fast: bool) -> FlowRequest:
    request = FlowRequest(f"r{len(side.requests)}", "a", 0, 0.0, 0, input_tokens)
    side.requests.append(request)
    if fast:
        side.core.enqueue_and_dispatch(request, 0.0)
    else:
        side.core.enqueue(request, 0.0)
        side.core.dispatch(0.0)
    return request


def _fields(config: BandConfig) -> dict:
    return {name: getattr(config, name) for name in BandConfig.__slots__}


FastPathMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
test_enqueue_and_dispatch_matches_enqueue_then_dispatch = FastPathMachine.TestCase
