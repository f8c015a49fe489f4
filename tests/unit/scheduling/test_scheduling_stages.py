"""Stage-aware flow control under P/D: the decode stage's credits and the
prefill stage's credits, both taken at dispatch, each released when its
stage ends; strict priority holds across the two stages."""

import random
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.config.loader import load_config
from epp.flowcontrol.config import FlowControlConfig, GateConfig, GateKind
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.request import FlowRequest, State
from epp.scheduling.core import build_gate
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.stages import PrefillCredits, prefiller_of, stage_gate, stage_pools

NOW = 10.0
PD_CONFIG = Path(__file__).resolve().parents[3] / "config" / "scenarios" / "pd-epp.yaml"
SCHEDULING = load_config(PD_CONFIG).scheduling
HIGH, LOW = 10, 0
CONCURRENCY = frozenset({GateKind.CONCURRENCY})
"""Fixed per-endpoint credits for the decode stage, so each test knows them."""


def pool(prefill: int, decode: int) -> PoolSnapshot:
    endpoints = [
        Endpoint(
            f"{role}-{i}",
            f"10.0.{0 if role == 'prefill' else 1}.{i}:8000",
            {"llm-d.ai/role": role},
            EndpointMetrics(updated_at=NOW),
        )
        for role, count in (("prefill", prefill), ("decode", decode))
        for i in range(1, count + 1)
    ]
    return PoolSnapshot(tuple(endpoints), 1, 1)


def pd_core(
    prefill: int, decode: int, per_decode: int, per_prefill: int
) -> tuple[FlowController, PrefillCredits]:
    snapshot = pool(prefill, decode)
    config = GateConfig(
        kinds=CONCURRENCY, max_per_endpoint=per_decode, max_per_prefill_endpoint=per_prefill
    )
    gate, credits = build_gate(config, lambda: snapshot, lambda: NOW)
    gate, prefill_credits = stage_gate(gate, per_prefill, SCHEDULING)
    assert prefill_credits is not None
    scheduler = Scheduler(
        SCHEDULING, lambda: snapshot, lambda: NOW, random.Random(1), credits, prefill_credits
    )
    return FlowController(FlowControlConfig(gate=config), gate, scheduler), prefill_credits


def request(name: str, priority: int, long: bool) -> FlowRequest:
    # A long prompt is 2,000 tokens of text of its own: never cached, so
    # always sent to prefill; a short one (10 tokens) never is.
    tokens = 2000 if long else 10
    prompt = (name + " ") * (tokens * 4 // (len(name) + 1))
    payload = InferenceRequest("m", "m", prompt=prompt, input_tokens=tokens)
    return FlowRequest(name, "tenant", priority, NOW, input_tokens=tokens, payload=payload)


def test_a_long_prompt_takes_a_prefill_credit_and_gives_it_back_when_its_prefill_ends():
    core, credits = pd_core(prefill=1, decode=1, per_decode=4, per_prefill=1)
    first, second = request("a", LOW, True), request("b", LOW, True)
    core.enqueue_and_dispatch(first, NOW)
    core.enqueue_and_dispatch(second, NOW)
    assert (first.state, second.state) == (State.DISPATCHED, State.QUEUED)
    assert prefiller_of(first) == "10.0.0.1:8000"
    assert credits.release(first)
    assert core.dispatch(NOW) == [second]
    assert not credits.release(first)  # once only; completion then finds nothing to free


def test_a_higher_band_waiting_for_a_prefill_slot_is_not_overtaken_by_a_lower_band():
    core, credits = pd_core(prefill=1, decode=1, per_decode=8, per_prefill=1)
    holder = request("holder", HIGH, True)
    core.enqueue_and_dispatch(holder, NOW)
    waiting = request("waiting", HIGH, True)
    local = request("local", LOW, False)  # needs no prefill server, and the decode one has room
    core.enqueue_and_dispatch(waiting, NOW)
    core.enqueue_and_dispatch(local, NOW)
    assert (waiting.state, local.state) == (State.QUEUED, State.QUEUED)
    credits.release(holder)
    assert core.dispatch(NOW) == [waiting, local]


def test_without_prefill_credits_a_long_prompt_goes_to_prefill_at_once():
    snapshot = pool(1, 1)
    gate, credits = build_gate(GateConfig(kinds=CONCURRENCY), lambda: snapshot, lambda: NOW)
    scheduler = Scheduler(SCHEDULING, lambda: snapshot, lambda: NOW, random.Random(1), credits)
    core = FlowController(FlowControlConfig(), gate, scheduler)
    requests = [request(str(i), LOW, True) for i in range(20)]
    for each in requests:
        core.enqueue_and_dispatch(each, NOW)
    assert all(prefiller_of(each) == "10.0.0.1:8000" for each in requests)


STEP = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from([HIGH, LOW]), st.booleans()),
    st.tuples(st.just("prefill-done"), st.integers(0, 200)),
    st.tuples(st.just("complete"), st.integers(0, 200)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=120), st.integers(1, 3), st.integers(1, 3))
def test_no_endpoint_ever_holds_more_than_its_credits_in_either_stage(
    steps, per_prefill, per_decode
):
    core, credits = pd_core(prefill=2, decode=2, per_decode=per_decode, per_prefill=per_prefill)
    sent: list[FlowRequest] = []
    prefilling: set[FlowRequest] = set()
    for number, step in enumerate(steps):
        if step[0] == "arrive":
            new = request(f"r{number}", step[1], step[2])
            _, dispatched = core.enqueue_and_dispatch(new, NOW)
        else:
            in_flight = [r for r in sent if r.state is State.DISPATCHED]
            if not in_flight:
                continue
            chosen = in_flight[step[1] % len(in_flight)]
            if step[0] == "prefill-done":
                credits.release(chosen)
                prefilling.discard(chosen)
                dispatched = core.dispatch(NOW)
            else:
                prefilling.discard(chosen)
                # a completion dispatches what its freed credits let through
                settled = core.complete(chosen, NOW)
                dispatched = [r for r in settled if r.state is State.DISPATCHED]
        for each in dispatched:
            sent.append(each)
            if prefiller_of(each) is not None:
                prefilling.add(each)
        decoding = Counter(r.endpoint for r in sent if r.state is State.DISPATCHED)
        assert max(decoding.values(), default=0) <= per_decode
        prefill = Counter(prefiller_of(r) for r in prefilling)
        assert max(prefill.values(), default=0) <= per_prefill
        assert all(credits.in_flight_at(e) == n for e, n in prefill.items())


def test_the_scheduler_says_which_stage_a_waiting_request_waits_for():
    core, _ = pd_core(prefill=1, decode=1, per_decode=2, per_prefill=1)
    placer = core.placer
    core.enqueue_and_dispatch(request("a", LOW, True), NOW)
    core.enqueue_and_dispatch(request("b", LOW, True), NOW)  # the prefill endpoint is full
    assert placer.waiting_for == "prefill"
    core.enqueue_and_dispatch(request("c", LOW, False), NOW)  # queued behind b
    assert placer.waiting_for == "prefill"
    short_core, _ = pd_core(prefill=1, decode=1, per_decode=1, per_prefill=4)
    short_core.enqueue_and_dispatch(request("d", LOW, False), NOW)
    short_core.enqueue_and_dispatch(request("e", LOW, False), NOW)  # the decode endpoint is full
    assert short_core.placer.waiting_for == "decode"


def test_the_stages_are_the_role_filters_partition_of_the_pool():
    roles = ["decode", "prefill", "both", None, "encode", "prefill-decode"]
    endpoints = tuple(
        Endpoint(f"e{i}", f"10.0.0.{i}:80", {"llm-d.ai/role": role} if role else {})
        for i, role in enumerate(roles)
    )
    parts = stage_pools(PoolSnapshot(endpoints, 3, 2))
    assert [e.name for e in parts["decode"].endpoints] == ["e0", "e2", "e3", "e5"]
    assert [e.name for e in parts["prefill"].endpoints] == ["e1", "e2", "e5"]
    assert stage_pools(PoolSnapshot(endpoints[:1], 1, 1)).keys() == {"decode"}
