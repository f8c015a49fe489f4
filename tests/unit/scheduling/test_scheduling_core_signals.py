"""`Core`, the one object a shell holds: every signal goes in through it and
it dispatches by itself. The prefill deadline, first tokens, latency,
admitters and the placer timer across a reload."""

from __future__ import annotations

import random

import pytest
import yaml

from epp.config.loader import EppConfig, parse_config
from epp.flowcontrol.gate import Placer
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.admitters import ProbabilisticAdmitter
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.core import Core, build_core
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.request import InferenceRequest
from tests.support.disagg import disagg_config

NOW = 100.0
PD = disagg_config(
    "{kinds: [concurrency], maxPerEndpoint: 4, maxPerPrefillEndpoint: 1, prefillTimeout: 5s}"
)
ROLE = "llm-d.ai/role"
PD_POOL = PoolSnapshot(
    (
        Endpoint("d", "10.0.0.1:8000", {ROLE: "decode"}, EndpointMetrics(updated_at=NOW)),
        Endpoint("p", "10.0.0.2:8000", {ROLE: "prefill"}, EndpointMetrics(updated_at=NOW)),
    ),
    1,
    1,
)
ONE_POOL = PoolSnapshot(
    (Endpoint("e", "10.0.0.1:8000", metrics=EndpointMetrics(updated_at=NOW)),), 1, 1
)
_numbers = iter(range(1_000_000))


def request(priority: int = 0) -> FlowRequest:
    payload = InferenceRequest("m", "m", prompt="p" * 400, input_tokens=100)
    return FlowRequest(f"r{next(_numbers)}", "tenant", priority, NOW, 10, 100, payload=payload)


def parse_config_text(text: str) -> EppConfig:
    return parse_config(yaml.safe_load(text))


def pd_core() -> Core:
    config = parse_config_text(PD)
    return build_core(
        config.flow_control, config.scheduling, lambda: PD_POOL, lambda: NOW, random.Random(0)
    )


def dispatched(core: Core, now: float = NOW) -> FlowRequest:
    sent = request()
    assert core.arrive(sent, now) == (None, [sent])
    return sent


def test_a_prefill_credit_held_past_the_timeout_returns_at_the_wakeup() -> None:
    core = pd_core()
    first = dispatched(core)
    second = request()
    assert core.arrive(second, NOW + 1) == (None, [])  # the one prefill credit is held
    assert core.next_wakeup() == NOW + 5
    assert core.poke(NOW + 4.9) == []
    assert core.poke(NOW + 5) == [second]
    assert first.state is State.DISPATCHED and core.in_prefill == 1


def test_prefill_done_returns_the_credit_once_and_dispatches_the_next() -> None:
    core = pd_core()
    first = dispatched(core)
    second = request()
    core.arrive(second, NOW)
    assert core.prefill_done(first, NOW + 1) == [second]
    assert core.prefill_done(first, NOW + 1) == []
    assert core.prefill_credits is not None and core.prefill_credits.in_flight == 1


def test_a_request_that_ends_in_its_prefill_leaves_no_deadline() -> None:
    core = pd_core()
    first = dispatched(core)
    core.complete(first, NOW + 1, Usage(100, 0))
    assert core.in_prefill == 0
    assert core.next_wakeup() == core.controller.next_wakeup()  # the idle-flow check alone


def test_a_reloaded_prefill_timeout_applies_to_the_prefills_under_way() -> None:
    core = pd_core()
    dispatched(core)
    config = parse_config_text(PD.replace("prefillTimeout: 5s", "prefillTimeout: 2s"))
    core.reload(config.flow_control, NOW)
    assert core.next_wakeup() == NOW + 2


def adaptive_core() -> Core:
    config = parse_config_text("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n")
    return build_core(
        config.flow_control, config.scheduling, lambda: ONE_POOL, lambda: NOW, random.Random(0)
    )


def test_the_first_token_reaches_the_adaptive_gate_through_the_core() -> None:
    core = adaptive_core()
    assert core.adaptive is not None
    sent = dispatched(core)
    core.first_token(sent, NOW + 0.1)
    assert sent.running


def test_a_completion_gives_the_adaptive_gate_its_latency() -> None:
    core = adaptive_core()
    sent = dispatched(core)
    core.complete(sent, NOW + 1, Usage(100, 11), itl=0.05)
    assert core.adaptive is not None
    assert core.adaptive._estimators["10.0.0.1:8000"].latency.itl == pytest.approx(0.05)


def test_without_an_adaptive_gate_first_tokens_and_latency_change_nothing() -> None:
    core = pd_core()
    sent = dispatched(core)
    assert core.adaptive is None and core.first_token(sent, NOW) == []
    assert not sent.running
    core.complete(sent, NOW + 1, Usage(100, 11), itl=0.05)
    assert sent.state is State.COMPLETED


UNSCRAPED = PoolSnapshot(tuple(Endpoint(e.name, e.address, e.labels) for e in PD_POOL.endpoints))
"""Endpoints without metrics: saturated, to the admitter."""


def admitting_core() -> Core:
    config = parse_config_text(PD)
    return build_core(
        config.flow_control,
        config.scheduling,
        lambda: UNSCRAPED,
        lambda: NOW,
        random.Random(0),
        admitters=(ProbabilisticAdmitter(),),
    )


def test_the_admitters_refuse_a_sheddable_request_on_a_saturated_pool() -> None:
    core = admitting_core()
    assert core.screen(request(-1), NOW) is not None
    assert core.screen(request(0), NOW) is None


def test_a_reload_replaces_the_admitters() -> None:
    core = admitting_core()
    core.reload(parse_config_text(PD).flow_control, NOW, admitters=())
    assert core.screen(request(-1), NOW) is None


class Counting:
    """A placer timer that counts the places it wraps."""

    def __init__(self) -> None:
        self.places = 0

    def wrap(self, placer: Placer) -> Placer:
        counting = self

        class Wrapped:
            def place(self, request):
                counting.places += 1
                return placer.place(request)

            def has_endpoints(self):
                return placer.has_endpoints()

        return Wrapped()


def test_the_placer_timer_wraps_the_scheduler_of_every_reload() -> None:
    config = parse_config_text(PD)
    timer = Counting()
    core = build_core(
        config.flow_control,
        config.scheduling,
        lambda: PD_POOL,
        lambda: NOW,
        random.Random(0),
        placer_timer=timer.wrap,
    )
    dispatched(core)
    core.reload(config.flow_control, NOW, scheduling=SchedulingConfig(), rng=random.Random(1))
    dispatched(core)
    assert timer.places == 2


def one_slot_core() -> Core:
    config = parse_config_text(
        "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\n"
        "flowControl: {gate: {kinds: [concurrency], maxPerEndpoint: 1}}\n"
    )
    return build_core(
        config.flow_control, config.scheduling, lambda: ONE_POOL, lambda: NOW, random.Random(0)
    )


def test_an_adopted_request_holds_its_endpoint_until_it_completes() -> None:
    core = one_slot_core()
    adopted = request()
    core.adopt(adopted, "10.0.0.1:8000", NOW)
    assert adopted.state is State.DISPATCHED and core.in_flight == 1
    waiting = request()
    assert core.arrive(waiting, NOW) == (None, [])  # the one credit is the adopted one's
    assert core.complete(adopted, NOW + 1) == [waiting]
    assert waiting.endpoint == "10.0.0.1:8000"


def test_a_request_already_queued_cannot_be_adopted() -> None:
    core = one_slot_core()
    dispatched(core)
    queued = request()
    core.arrive(queued, NOW)
    with pytest.raises(ValueError, match="already enqueued"):
        core.adopt(queued, "10.0.0.1:8000", NOW)


def test_adopted_requests_that_end_before_the_next_sample_keep_the_learned_limit() -> None:
    """A new decider adopts what the replicas run, some of which ends before
    its next sample: those are not requests sent since the sample and done
    unseen, so the endpoint keeps its learned limit, not the fixed one (32)."""
    pool = [PoolSnapshot((Endpoint("e", "10.0.0.1:8000", metrics=EndpointMetrics(
        running=10, updated_at=NOW)),), 1, 1)]  # fmt: skip
    now = [NOW]
    config = parse_config_text(
        "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\n"
        "flowControl: {gate: {kinds: [adaptive], maxPerEndpoint: 32}}\n"
    )
    core = build_core(
        config.flow_control, config.scheduling, lambda: pool[0], lambda: now[0], random.Random(0)
    )
    core.seed_limits({"10.0.0.1:8000": 16}, NOW)
    adopted = [request() for _ in range(10)]
    for each in adopted:
        core.adopt(each, "10.0.0.1:8000", NOW)
    now[0] = NOW + 0.01
    for each in adopted[:3]:
        core.complete(each, now[0])
    now[0] = NOW + 0.05
    pool[0] = PoolSnapshot((Endpoint("e", "10.0.0.1:8000", metrics=EndpointMetrics(
        running=7, updated_at=now[0])),), 2, 1)  # fmt: skip
    for _ in range(40):
        core.arrive(request(), now[0])
    assert core.in_flight <= 16
