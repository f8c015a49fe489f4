"""The asyncio adapter over the core: admit, complete, cancel,
TTL and idle timers, poke, graceful shutdown."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.core import Core
from epp.serve.admission import AdmissionController
from tests.support.placers import LeastLoadedPlacer

ENDPOINT = "10.0.0.1:8000"
_ids = itertools.count()


class Pool:
    """An admission controller over a pool of one endpoint and `max_in_flight`
    credits, recording every outcome it reports."""

    def __init__(self, max_in_flight: int = 1, clock=time.monotonic, **config) -> None:
        self.gate = ConcurrencyGate(max_in_flight=max_in_flight)
        self.controller = FlowController(
            FlowControlConfig(**config),
            self.gate,
            LeastLoadedPlacer(lambda: [ENDPOINT], self.gate),
            on_flows_collected=self.on_collected,
        )
        self.reported: list[tuple[FlowRequest, Outcome, float]] = []
        self.collected: list[list[FlowKey]] = []
        self.collected_event = asyncio.Event()
        self.completed: list[FlowRequest] = []
        self.clock = clock
        self.admission = AdmissionController(
            Core(self.controller), clock, on_outcome=self.report, on_complete=self.completed.append
        )

    def report(self, request: FlowRequest, now: float) -> None:
        self.reported.append((request, request.outcome, now))

    def on_collected(self, keys: list[FlowKey]) -> None:
        self.collected.append(keys)
        self.collected_event.set()

    def outcomes(self, request: FlowRequest) -> list[Outcome]:
        return [outcome for r, outcome, _ in self.reported if r is request]

    def decided_at(self, request: FlowRequest) -> float:
        (when,) = [now for r, _, now in self.reported if r is request]
        return when

    def request(self, fairness_id: str = "tenant-a", **fields) -> FlowRequest:
        """A request arriving now on the pool's clock."""
        return new_request(fairness_id, arrival=self.clock(), **fields)

    async def occupy(self) -> FlowRequest:
        """Take every credit with requests that never complete on their own."""
        first = None
        for _ in range(self.gate.max_in_flight):
            r = new_request()
            assert await self.admission.admit(r) is Outcome.DISPATCHED
            first = first or r
        return first

    async def queue(self, request: FlowRequest) -> asyncio.Task[Outcome]:
        task = asyncio.create_task(self.admission.admit(request))
        await asyncio.sleep(0)
        assert request.state is State.QUEUED
        return task


def new_request(fairness_id: str = "tenant-a", **fields) -> FlowRequest:
    fields.setdefault("arrival", time.monotonic())
    return FlowRequest(request_id=f"r{next(_ids)}", fairness_id=fairness_id, priority=0, **fields)


class Clock:
    """The injected clock: time moves only when a test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def cancel_just_after_dispatch(pool: Pool) -> tuple[FlowRequest, FlowRequest]:
    """(holder, waiting): `waiting` is dispatched by the holder's completion,
    then its client's task is cancelled before it runs again."""
    holder = await pool.occupy()
    waiting = new_request()
    task = await pool.queue(waiting)
    pool.admission.complete(holder)
    assert waiting.state is State.DISPATCHED
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return holder, waiting


async def test_admit_returns_dispatched_without_waiting_when_there_is_room():
    pool = Pool(max_in_flight=1)
    r = new_request()
    admit = pool.admission.admit(r)
    with pytest.raises(StopIteration) as returned:
        admit.send(None)
    assert returned.value.value is Outcome.DISPATCHED
    assert (r.endpoint, pool.admission.in_flight, pool.outcomes(r)) == (
        ENDPOINT,
        1,
        [Outcome.DISPATCHED],
    )


async def test_queued_request_is_dispatched_when_another_completes():
    pool = Pool(max_in_flight=1)
    running = await pool.occupy()
    waiting = new_request()
    task = await pool.queue(waiting)
    pool.admission.complete(running, Usage(1, 5))
    assert await asyncio.wait_for(task, 1.0) is Outcome.DISPATCHED
    assert (pool.admission.queued, pool.admission.in_flight) == (0, 1)


async def test_cancelling_the_awaiting_task_removes_the_request_and_reports_cancelled():
    pool = Pool(max_in_flight=1)
    await pool.occupy()
    waiting = new_request(byte_size=10)
    task = await pool.queue(waiting)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (pool.admission.queued, pool.controller.queued_bytes) == (0, 0)
    assert pool.outcomes(waiting) == [Outcome.CANCELLED]


async def test_thousand_tasks_cancelled_while_queued_leave_nothing_queued_or_in_flight():
    pool = Pool(max_in_flight=1)
    running = await pool.occupy()
    requests = [new_request(f"tenant-{i % 10}") for i in range(1000)]
    tasks = [asyncio.create_task(pool.admission.admit(r)) for r in requests]
    await asyncio.sleep(0)
    assert pool.admission.queued == 1000
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results)
    assert pool.admission.queued == 0
    pool.admission.complete(running)
    assert (pool.admission.queued, pool.admission.in_flight, pool.gate.in_flight) == (0, 0, 0)
    assert all(pool.outcomes(r) == [Outcome.CANCELLED] for r in requests)


async def test_cancelling_a_task_dispatched_a_moment_earlier_hands_back_its_credit():
    pool = Pool(max_in_flight=1)
    await cancel_just_after_dispatch(pool)
    assert (pool.admission.in_flight, pool.gate.in_flight) == (0, 0)


def test_offer_decides_at_once_when_there_is_room():
    pool = Pool(max_in_flight=1)
    r = new_request()
    assert pool.admission.offer(r) is Outcome.DISPATCHED
    assert (r.endpoint, pool.admission.in_flight) == (ENDPOINT, 1)


async def test_offer_of_a_request_that_must_queue_is_none_and_wait_gives_its_outcome():
    pool = Pool(max_in_flight=1)
    running = await pool.occupy()
    waiting = new_request()
    assert pool.admission.offer(waiting) is None
    assert waiting.state is State.QUEUED
    task = asyncio.create_task(pool.admission.wait(waiting))
    await asyncio.sleep(0)
    pool.admission.complete(running)
    assert await asyncio.wait_for(task, 1.0) is Outcome.DISPATCHED


async def test_withdraw_removes_a_queued_request_and_repeating_it_changes_nothing():
    pool = Pool(max_in_flight=1)
    await pool.occupy()
    waiting = new_request(byte_size=10)
    assert pool.admission.offer(waiting) is None
    pool.admission.withdraw(waiting)
    pool.admission.withdraw(waiting)
    counts = (pool.admission.queued, pool.controller.queued_bytes, pool.admission.in_flight)
    assert counts == (0, 0, 1)
    assert pool.outcomes(waiting) == [Outcome.CANCELLED]


async def test_withdraw_of_a_request_dispatched_a_moment_earlier_hands_back_its_credit():
    pool = Pool(max_in_flight=1)
    running = await pool.occupy()
    waiting = new_request()
    assert pool.admission.offer(waiting) is None
    pool.admission.complete(running)
    assert waiting.state is State.DISPATCHED
    pool.admission.withdraw(waiting)
    assert (pool.admission.in_flight, pool.gate.in_flight) == (0, 0)
    assert pool.completed == [running, waiting]


async def test_the_timer_is_armed_for_the_ttl_deadline():
    clock = Clock()
    pool = Pool(max_in_flight=1, clock=clock)
    await pool.occupy()
    r = pool.request(ttl=0.05)
    await pool.queue(r)
    assert pool.admission.wakeup_at == r.deadline == 100.05
    await pool.admission.shutdown(0.0)


async def test_ttl_expires_at_the_deadline_not_before():
    clock = Clock()
    pool = Pool(max_in_flight=1, clock=clock)
    await pool.occupy()
    r = pool.request(ttl=0.05)
    task = await pool.queue(r)
    clock.now = 100.04999
    pool.admission.poke()
    await asyncio.sleep(0)
    assert not task.done()
    clock.now = 100.05
    pool.admission.poke()
    assert await task is Outcome.REJECTED_TTL_EXPIRED
    assert pool.decided_at(r) == 100.05
    assert pool.admission.queued == 0


async def test_the_timer_expires_a_request_by_itself():
    pool = Pool(max_in_flight=1)
    await pool.occupy()
    task = await pool.queue(pool.request(ttl=0.05))
    assert await asyncio.wait_for(task, 1.0) is Outcome.REJECTED_TTL_EXPIRED
    assert pool.admission.queued == 0


async def test_shorter_request_ttl_rearms_the_timer_earlier():
    clock = Clock()
    pool = Pool(max_in_flight=1, clock=clock)
    await pool.occupy()
    await pool.queue(pool.request(ttl=30.0))
    assert pool.admission.wakeup_at == 130.0
    await pool.queue(pool.request(ttl=0.05))
    assert pool.admission.wakeup_at == 100.05
    await pool.admission.shutdown(0.0)


async def test_poke_dispatches_after_a_gate_change():
    pool = Pool(max_in_flight=1)
    await pool.occupy()
    task = await pool.queue(new_request())
    pool.gate.max_in_flight = 2
    await asyncio.sleep(0)
    assert not task.done()
    pool.admission.poke()
    assert await asyncio.wait_for(task, 1.0) is Outcome.DISPATCHED


async def test_shutdown_rejects_new_admits_as_shutting_down():
    pool = Pool(max_in_flight=1)
    await pool.admission.shutdown(1.0)
    r = new_request()
    assert await pool.admission.admit(r) is Outcome.REJECTED_SHUTTING_DOWN
    assert pool.outcomes(r) == [Outcome.REJECTED_SHUTTING_DOWN]


async def test_shutdown_lets_the_queue_drain_within_the_grace_period():
    pool = Pool(max_in_flight=1)
    running = await pool.occupy()
    waiting = [new_request(), new_request()]
    tasks = [await pool.queue(r) for r in waiting]
    shutdown = asyncio.create_task(pool.admission.shutdown(5.0))
    await asyncio.sleep(0)
    late = new_request()
    assert await pool.admission.admit(late) is Outcome.REJECTED_SHUTTING_DOWN
    pool.admission.complete(running)
    assert await tasks[0] is Outcome.DISPATCHED
    pool.admission.complete(waiting[0])
    assert await tasks[1] is Outcome.DISPATCHED
    await asyncio.wait_for(shutdown, 1.0)  # drained: well before the 5 s grace


async def test_shutdown_ends_what_is_still_queued_after_the_grace_period():
    pool = Pool(max_in_flight=1)
    running = await pool.occupy()
    waiting = [new_request(), new_request("tenant-b")]
    tasks = [await pool.queue(r) for r in waiting]
    shutdown = asyncio.create_task(pool.admission.shutdown(0.05))
    await asyncio.sleep(0)
    assert not any(task.done() for task in tasks)  # queued through the grace period
    await shutdown
    assert [await t for t in tasks] == [Outcome.REJECTED_SHUTTING_DOWN] * 2
    assert all(pool.outcomes(r) == [Outcome.REJECTED_SHUTTING_DOWN] for r in waiting)
    assert (pool.admission.queued, pool.admission.in_flight) == (0, 1)
    assert running.state is State.DISPATCHED


async def test_idle_flows_are_collected_by_the_timer_and_reported():
    pool = Pool(max_in_flight=1, flow_idle_timeout=0.05)
    r = new_request("tenant-x")
    assert await pool.admission.admit(r) is Outcome.DISPATCHED
    pool.admission.complete(r)
    await asyncio.wait_for(pool.collected_event.wait(), 1.0)
    assert pool.collected == [[FlowKey("tenant-x", 0)]]
    assert pool.controller.band(0) is None or pool.controller.band(0).flows == {}


async def test_on_complete_is_told_of_a_request_dispatched_just_before_its_client_left():
    pool = Pool(max_in_flight=1)
    holder, waiting = await cancel_just_after_dispatch(pool)
    assert pool.completed == [holder, waiting]
    assert pool.controller.in_flight == 0


async def test_each_call_into_the_core_is_one_timed_dispatch_cycle():
    cycles: list[float] = []
    enqueued: list[tuple[FlowRequest, Outcome | None]] = []
    pool = Pool(max_in_flight=1)
    pool.admission = AdmissionController(
        Core(pool.controller),
        on_cycle=cycles.append,
        on_enqueued=lambda request, seconds: enqueued.append((request, request.outcome)),
    )
    holder = await pool.occupy()
    waiting = new_request()
    task = await pool.queue(waiting)
    pool.admission.poke()
    pool.admission.complete(holder)
    await task
    assert len(cycles) == 4  # two arrivals, the poke, the completion
    assert all(0.0 <= seconds < 1.0 for seconds in cycles)
    assert enqueued == [(holder, Outcome.DISPATCHED), (waiting, None)]
