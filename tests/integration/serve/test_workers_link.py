"""The core owner and its protocol workers over real local sockets
(`epp.serve.owner`, `epp.serve.worker`, `epp.serve.wire`), in one event
loop: the same trace of events through the in-process admission controller
and through owner plus workers decides the same requests, on the same
endpoints, in the same order; a worker's death returns its credits once;
the owner's death ends what waits with a clear outcome."""

from __future__ import annotations

import asyncio
import random
import socket
from dataclasses import dataclass, field

import orjson
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.config.loader import parse_config
from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.store import EndpointStore
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.core import Core, build_core
from epp.scheduling.prefix import block_hashes
from epp.scheduling.request import InferenceRequest
from epp.serve import wire
from epp.serve.admission import AdmissionController
from epp.serve.assembly import decided_then
from epp.serve.metrics.recorder import RequestMetrics
from epp.serve.metrics.shipping import take
from epp.serve.owner import Owner, WorkerSlot
from epp.serve.tokenizer import CacheUse, TokenizerStats
from epp.serve.worker import RemoteAdmission
from tests.support.series import shown

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: prefix-cache-scorer
- type: approx-prefix-cache-producer
  parameters: {autoTune: false, blockSizeTokens: 2, maxPrefixBlocksToMatch: 16}
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
flowControl:
  defaultRequestTTL: 0s
  gate: {kinds: [concurrency], maxPerEndpoint: 2}
"""
ENDPOINTS = [EndpointSpec(f"pod-{i}", f"10.0.0.{i}:8000") for i in range(1, 4)]
PRIORITIES = {"high": 10, "low": -1}
PROMPTS = ["alpha beta gamma", "alpha beta delta", "zeta eta theta", "iota kappa", ""]


def priority_of(headers) -> int:
    return PRIORITIES.get(headers.get("x-llm-d-inference-objective", ""), 0)


def make_core(clock) -> Core:
    config = parse_config(yaml.safe_load(CONFIG))
    store = EndpointStore()
    store.replace_all(ENDPOINTS)
    core = build_core(
        config.flow_control, config.scheduling, store.snapshot, clock, random.Random(7)
    )
    core.ensure_bands(PRIORITIES.values())
    return core


def make_request(number: int, tenant: str, objective: str, prompt: str, now: float) -> FlowRequest:
    """A request as the stream machine builds it (priority from its headers)."""
    headers = {"x-llm-d-inference-objective": objective} if objective else {}
    tokens = 1 + len(prompt) // 4
    return FlowRequest(
        request_id=f"r{number}",
        fairness_id=tenant,
        priority=priority_of(headers),
        arrival=now,
        byte_size=40 + len(prompt),
        input_tokens=tokens,
        payload=InferenceRequest(
            model="m", target_model="m", prompt=prompt, input_tokens=tokens, headers=headers
        ),
    )


Decision = tuple[str, str, str | None]


def decision(request: FlowRequest) -> Decision:
    assert request.outcome is not None
    return request.request_id, request.outcome.value, request.endpoint


@dataclass
class Remote:
    """Owner (its own core) plus `workers` RemoteAdmissions over socketpairs."""

    owner: Owner
    core: Core
    admission: AdmissionController
    workers: list[RemoteAdmission]
    worker_links: list[wire.Link]
    owner_decided: list[Decision] = field(default_factory=list)


def endpoint_names(address: str) -> tuple[str, str]:
    return next(e.name for e in ENDPOINTS if e.address == address), "default"


def request_metrics() -> RequestMetrics:
    return RequestMetrics("pool", endpoint_names=endpoint_names)


def recording(decided: list[Decision], then):
    """An `on_outcome` noting the decision in `decided`, then `then`."""

    def on_outcome(request: FlowRequest, now: float) -> None:
        decided.append(decision(request))
        then(request, now)

    return on_outcome


async def remote_stack(workers: int, clock, metrics: RequestMetrics | None = None) -> Remote:
    """With `metrics`, the owner records there and its workers record the
    outcome series (each a `RequestMetrics` of its own) as `epp serve` wires them."""
    core = make_core(clock)
    owner = Owner(workers, spec=None, priority_of=priority_of, outcomes=metrics)  # type: ignore[arg-type]
    decided: list[Decision] = []
    then = decided_then(
        owner.decided, metrics.on_outcome if metrics is not None else lambda request, now: None
    )
    admission = AdmissionController(
        core, clock, on_outcome=recording(decided, then), on_queued=metrics and metrics.on_queued
    )
    owner.admission = admission
    core.on_evict = owner.evict
    remotes, links = [], []
    loop = asyncio.get_running_loop()
    for slot in owner.slots:
        owner_end, worker_end = socket.socketpair()
        await owner.attach(slot, owner_end)
        remote = RemoteAdmission(metrics=request_metrics() if metrics is not None else None)
        if remote.metrics is not None:
            remote.metrics.flows_here = False
        link = wire.Link(remote.on_messages, remote.on_lost)
        remote.link = link
        await loop.connect_accepted_socket(lambda link=link: link, worker_end)
        remotes.append(remote)
        links.append(link)
    return Remote(owner, core, admission, remotes, links, decided)


def in_core(core: Core) -> tuple[int, int]:
    return core.in_flight, core.queued_requests


async def settled(condition, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "the owner and workers never caught up"
        await asyncio.sleep(0.001)


arrive = st.tuples(
    st.just("arrive"),
    st.integers(0, 1),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["", "high", "low"]),
    st.sampled_from(PROMPTS),
)
complete = st.tuples(st.just("complete"), st.integers(0, 50), st.integers(0, 300))
cancel = st.tuples(st.just("cancel"), st.integers(0, 50))
traces = st.lists(st.one_of(arrive, arrive, complete, cancel), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces)
def test_a_trace_decides_the_same_through_owner_and_workers_as_in_process(trace) -> None:
    asyncio.run(run_both(trace))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces)
def test_a_trace_shows_the_same_outcome_series_on_the_owners_page_as_in_process(trace) -> None:
    asyncio.run(run_both(trace, with_metrics=True))


def outcome_page(metrics: RequestMetrics) -> dict:
    """The outcome and stream series (those a worker ships) and the queue gauges, as shown."""
    return shown([*metrics.shipped_families(), metrics.queue_size, metrics.queue_bytes])


async def run_both(trace, with_metrics: bool = False) -> None:
    now = [100.0]

    def clock() -> float:
        return now[0]

    local_decided: list[Decision] = []
    local_metrics = request_metrics()
    local = AdmissionController(
        make_core(clock),
        clock,
        on_outcome=recording(local_decided, local_metrics.on_outcome),
        on_queued=local_metrics.on_queued,
        on_complete=local_metrics.on_complete,
    )
    owner_metrics = request_metrics() if with_metrics else None
    remote = await remote_stack(2, clock, owner_metrics)
    # what each side holds, in arrival order: (local request, worker request, worker)
    held: list[tuple[FlowRequest, FlowRequest, RemoteAdmission]] = []
    worker_decided: list[Decision] = []
    waits: list[asyncio.Task] = []
    withdrawn: set[str] = set()

    async def wait_on(worker: RemoteAdmission, request: FlowRequest) -> None:
        await worker.wait(request)
        worker_decided.append(decision(request))

    for number, op in enumerate(trace):
        now[0] += 0.01
        if op[0] == "arrive":
            _, index, tenant, objective, prompt = op
            mine = make_request(number, tenant, objective, prompt, now[0])
            theirs = make_request(number, tenant, objective, prompt, now[0])
            worker = remote.workers[index]
            held.append((mine, theirs, worker))
            local.offer(mine)
            assert worker.offer(theirs) is None
            waits.append(asyncio.create_task(wait_on(worker, theirs)))
        else:
            state = State.DISPATCHED if op[0] == "complete" else State.QUEUED
            chosen = [entry for entry in held if entry[0].state is state]
            if not chosen:
                continue
            mine, theirs, worker = chosen[op[1] % len(chosen)]
            if op[0] == "complete":
                assert theirs.state is State.DISPATCHED
                local.complete(mine, Usage(mine.input_tokens, op[2]))
                worker.complete(theirs, Usage(theirs.input_tokens, op[2]))
            else:
                withdrawn.add(mine.request_id)
                local.withdraw(mine)
                worker.withdraw(theirs)
        # each event reaches the owner's core before the next one happens (at its time)
        await settled(lambda: len(remote.owner_decided) == len(local_decided))
        await settled(lambda: in_core(remote.core) == in_core(local.core))
        told = sum(d[0] not in withdrawn for d in remote.owner_decided)
        await settled(lambda told=told: len(worker_decided) == told)
    assert remote.owner_decided == local_decided
    assert worker_decided == [d for d in local_decided if d[0] not in withdrawn]
    if owner_metrics is not None:
        await asyncio.sleep(0)  # the workers record an outcome after its reply
        merge = owner_metrics.merge()
        for index, worker in enumerate(remote.workers):
            assert worker.metrics is not None
            merge.add(index, orjson.loads(orjson.dumps(take(worker.metrics.shipped_families()))))
        assert outcome_page(owner_metrics) == outcome_page(local_metrics)
    for task in waits:
        task.cancel()
    for link in remote.worker_links:
        link.close()


async def test_a_dead_workers_requests_leave_the_queue_and_return_their_credits_once() -> None:
    remote = await remote_stack(2, lambda: 5.0)
    dying, surviving = remote.workers
    held = [make_request(n, "a", "", "p", 5.0) for n in range(7)]  # 3 endpoints x 2 credits
    for request in held:
        dying.offer(request)
    await settled(lambda: remote.core.in_flight == 6 and remote.core.queued_requests == 1)
    waiting = make_request(99, "b", "", "q", 5.0)
    surviving.offer(waiting)
    outcome = asyncio.create_task(surviving.wait(waiting))
    await settled(lambda: remote.core.queued_requests == 2)

    remote.worker_links[0].close()  # the worker's process is gone

    assert await asyncio.wait_for(outcome, 2.0) is Outcome.DISPATCHED
    await settled(lambda: remote.core.queued_requests == 0)
    assert remote.core.in_flight == 1  # only the survivor's request holds a credit
    assert remote.core.credits is not None and remote.core.credits.in_flight == 1
    assert remote.owner.slots[0].requests == {}


async def test_a_stopping_owner_hands_back_no_credit_its_workers_still_serve() -> None:
    # Its workers serve their streams on for their final flush: in a
    # forwarding replica, a credit handed back now would be given out again
    # by the decider while the request still runs.
    remote = await remote_stack(1, lambda: 5.0)
    (worker,) = remote.workers
    held = [make_request(n, "a", "", "p", 5.0) for n in range(2)]
    for request in held:
        worker.offer(request)
    await settled(lambda: remote.core.in_flight == 2)

    await remote.owner.stop()
    await settled(lambda: remote.owner.slots[0].link.closed)  # type: ignore[union-attr]

    assert remote.core.in_flight == 2


async def test_when_the_owner_is_gone_waiting_and_new_requests_end_shutting_down() -> None:
    remote = await remote_stack(1, lambda: 5.0)
    (worker,) = remote.workers
    for request in [make_request(n, "a", "", "p", 5.0) for n in range(6)]:
        worker.offer(request)
    queued = make_request(50, "a", "", "p", 5.0)
    worker.offer(queued)
    outcome = asyncio.create_task(worker.wait(queued))
    await settled(lambda: remote.core.queued_requests == 1)

    slot: WorkerSlot = remote.owner.slots[0]
    assert slot.link is not None
    slot.link.close()  # the owner's end: as if its process died

    assert await asyncio.wait_for(outcome, 2.0) is Outcome.REJECTED_SHUTTING_DOWN
    later = make_request(51, "a", "", "p", 5.0)
    assert worker.offer(later) is Outcome.REJECTED_SHUTTING_DOWN
    assert worker.owner_gone.is_set()


async def test_an_evicted_request_is_ended_by_its_worker() -> None:
    remote = await remote_stack(1, lambda: 5.0)
    (worker,) = remote.workers
    evicted: list[str] = []
    worker.on_evict = lambda request: evicted.append(request.request_id)
    request = make_request(1, "a", "", "p", 5.0)
    worker.offer(request)
    await settled(lambda: remote.core.in_flight == 1)

    remote.owner.evict(next(iter(remote.owner.slots[0].requests.values())))

    await settled(lambda: evicted == ["r1"])


async def test_the_worker_hashes_prompts_with_the_owners_prefix_geometry() -> None:
    remote = await remote_stack(1, lambda: 5.0)
    (worker,) = remote.workers
    first = make_request(1, "a", "", "alpha beta gamma", 5.0)
    worker.offer(first)  # the owner answers with its geometry after this frame
    await settled(lambda: remote.core.in_flight == 1)
    await settled(lambda: worker._geometry is not None)

    second = make_request(2, "a", "", "alpha beta delta", 5.0)
    worker.offer(second)
    await settled(lambda: remote.core.in_flight == 2)

    block_chars, max_blocks = worker._geometry
    expected = block_hashes("alpha beta delta", "m", block_chars, max_blocks)
    assert second.payload.prefix_hashes == (block_chars, max_blocks, expected)
    at_owner = next(r for r in remote.owner.slots[0].requests.values() if r.request_id == "r2")
    assert at_owner.payload.prefix_hashes == (block_chars, max_blocks, expected)


async def test_a_request_cancelled_as_its_decision_crosses_is_recorded_once_by_the_owner() -> None:
    metrics = request_metrics()
    remote = await remote_stack(1, lambda: 5.0, metrics)
    (worker,) = remote.workers
    request = make_request(1, "a", "", "p", 5.0)
    worker.offer(request)
    worker.withdraw(request)  # the CANCEL leaves in the ARRIVE's frame, before the DECISION

    await settled(lambda: remote.owner_decided != [] and remote.core.in_flight == 0)
    await asyncio.sleep(0.01)  # the DECISION reaches the worker, which knows the request no more
    assert worker.metrics is not None
    metrics.merge().add(0, orjson.loads(orjson.dumps(take(worker.metrics.shipped_families()))))

    assert [d[:2] for d in remote.owner_decided] == [("r1", "dispatched")]
    assert sum(metrics.request_total.values.values()) == 1
    assert remote.owner.slots[0].recorded == {}


async def test_a_worker_told_a_decision_it_did_not_take_does_not_cancel_it() -> None:
    metrics = request_metrics()
    remote = await remote_stack(1, lambda: 5.0, metrics)
    (worker,) = remote.workers
    remote.admission.core.close()  # every arrival is rejected now
    request = make_request(1, "a", "", "p", 5.0)
    worker.offer(request)
    await settled(lambda: request.outcome is not None)

    worker.withdraw(request)  # the stream ends after its rejection
    await asyncio.sleep(0.01)
    assert worker.metrics is not None
    metrics.merge().add(0, orjson.loads(orjson.dumps(take(worker.metrics.shipped_families()))))

    assert sum(metrics.request_total.values.values()) == 1
    assert remote.owner.slots[0].requests == {}


async def test_a_worker_forwards_the_body_priority_its_owner_decided() -> None:
    remote = await remote_stack(1, lambda: 5.0)
    remote.owner.priority_in_body = lambda request: -request.priority
    (worker,) = remote.workers
    request = make_request(1, "a", "high", "p", 5.0)
    worker.offer(request)
    await settled(lambda: request.state is State.DISPATCHED)

    assert worker.priority_in_body(request) == -PRIORITIES["high"]


async def test_a_worker_answers_the_model_list_its_owner_last_published() -> None:
    remote = await remote_stack(1, lambda: 5.0)
    (worker,) = remote.workers
    assert worker.models() is None
    remote.owner.publish_models(b'{"object":"list","data":[{"id":"base"}]}')
    await settled(lambda: worker.models() is not None)
    assert orjson.loads(worker.models()) == {"object": "list", "data": [{"id": "base"}]}

    remote.owner.publish_models(None)  # every endpoint left
    await settled(lambda: worker.models() is None)


async def test_a_worker_forwards_the_body_as_sent_once_its_owner_stops_propagating() -> None:
    remote = await remote_stack(1, lambda: 5.0)
    (worker,) = remote.workers
    request = make_request(1, "a", "high", "p", 5.0)
    worker.offer(request)
    await settled(lambda: request.state is State.DISPATCHED)

    assert worker.priority_in_body(request) is None


async def test_the_owner_counts_what_its_workers_token_producers_tokenized() -> None:
    remote = await remote_stack(2, lambda: 5.0)
    for worker, (tokenized, busy) in zip(remote.workers, ((3, 1), (5, 0)), strict=True):
        worker.metrics = request_metrics()
        worker.tokenizer = TokenizerStats(tokenized)
        worker.tokenizer.fallbacks["busy"] += busy
        worker.ship()
        worker.tokenizer.tokenized += 1  # counted once: only the growth ships
        worker.ship()
    stats = remote.owner.tokenizer
    await settled(lambda: stats.tokenized == 10)
    assert stats.fallbacks == {"busy": 1}


async def test_the_owner_sums_its_workers_token_caches_and_keeps_a_dead_ones_drops() -> None:
    remote = await remote_stack(2, lambda: 5.0)
    for worker, (entries, dropped) in zip(remote.workers, ((7, 2), (4, 0)), strict=True):
        worker.metrics = request_metrics()
        use = CacheUse(entries, 10, dropped)
        worker.tokenizer = TokenizerStats(caches=lambda use=use: {"prefix-store": use})
        worker.ship()
    stats = remote.owner.tokenizer
    await settled(lambda: stats.caches() == {"prefix-store": CacheUse(11, 20, 2)})

    remote.worker_links[0].close()  # its process is gone, and its store with it

    await settled(lambda: stats.caches() == {"prefix-store": CacheUse(4, 10, 2)})
