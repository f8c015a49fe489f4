"""Fair sharing between the flows of one priority band.

A policy owns the band's queues and decides which queued request is next,
and owns the per-flow state it keeps on the flows (`ring_member`; `counter`
and `heap_seq`): nothing else writes it, and `adopt` resets it when a band
changes policy. The controller keeps the counts; a policy sees a flow's
`count` already updated when it is told of a push (they include
the new request) or a take (they exclude the taken request).

`round-robin`: dispatch turns. Backlogged flows stand in a ring; the flow at
the front dispatches one request and goes to the back if it still has any.
Between two continuously backlogged flows the number of dispatches differs by
at most one. Cheap, but blind to request size: a tenant of long prompts gets
as many turns as one of short prompts.

`vtc`: the Virtual Token Counter of Sheng et al., "Fairness in Serving Large
Language Models" (OSDI 2024). Each flow has a counter of the service it has
received, in weighted tokens: at dispatch it is charged input_weight x the
estimated input tokens; at completion it is charged output_weight x the output
tokens and the input charge is corrected to the real count. The backlogged
flow with the smallest counter goes next. A flow that becomes backlogged is
lifted to the smallest counter among the backlogged flows (or, when none is
backlogged, to the counter of the flow served last), so idleness banks no
credit. Between two continuously backlogged flows the counters differ by at
most 2U, the paper's bound, where U is the most a flow can be charged for the
requests it has in flight at once (the paper's U = max(w_in x L_input,
w_out x M), M the batch's token capacity, for the same reason): with one
request in flight per flow, the largest single-request charge.
Backlogged flows sit in a binary heap keyed by counter: O(log F) per dispatch.

`program-aware`: the reference's `program-aware-fairness` with its `las`
(least attained service) strategy. A program is a flow's fairness id. Its
attained service is input + 2 x output tokens of the response's usage (the
estimated input when the usage reports none), added at completion, and it
halves every `half_life` seconds of the clock; the decay is folded in lazily
(only a completion writes it), so an idle program ages out without being
visited. Each pick scores every backlogged flow: `weight_service` x (1 -
its service range-normalized over the backlogged flows) + `weight_head_wait`
x (its head request's wait, range-normalized); equal values normalize to
0.5, so on a cold start the oldest head goes first. The best score wins,
the earliest backlogged on a tie. The state of a program with nothing queued
or in flight and no completion for `eviction_ttl` is dropped by a sweep run
at most every `eviction_sweep` seconds, on the first pick or completion
after it falls due; so the programs kept are those active within the TTL
(as the reference's: a fresh fairness id per request keeps one small entry
per request for the TTL; lower `evictionTtlSeconds` for such traffic).
Unlike the reference, whose one plugin instance keeps
programs across every band that names it, each band keeps its own: a
program's service in one priority does not delay it in another.
A pick is O(F): the backlogged flows of a band are bounded by its
`max_requests` (each holds at least one request).

`global-strict`: no fairness. The band's requests share one queue, so the
best head across all flows (the oldest under FCFS) goes next.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, heapreplace
from itertools import islice
from math import exp2
from typing import Protocol

from epp.flowcontrol.config import BandConfig, Fairness, Ordering, ProgramAwareConfig
from epp.flowcontrol.flow import Flow
from epp.flowcontrol.ordering import RequestQueue, make_flow_queue, make_queue
from epp.flowcontrol.request import FlowRequest, Usage


class FairnessPolicy(Protocol):
    def new_queue(self) -> RequestQueue | None:
        """The queue of a new flow: None when the flow is its own FIFO queue,
        or when the policy keeps one queue for the whole band."""
        ...

    def push(self, request: FlowRequest, flow: Flow) -> None: ...

    def peek(self, now: float) -> FlowRequest | None:
        """The request that goes next at `now`, or None when nothing is queued."""
        ...

    def take(self, request: FlowRequest, flow: Flow) -> None:
        """Dispatch `request`, the one `peek` just returned."""
        ...

    def discard(self, request: FlowRequest, flow: Flow) -> None:
        """`request` left the queue without dispatch (cancelled, expired)."""
        ...

    def take_arrival(self, request: FlowRequest, flow: Flow) -> None:
        """Dispatch `request` as it arrives while nothing is queued in the
        band: leave the state that `push`, `peek` and `take` would, without
        queueing it."""
        ...

    def on_complete(
        self, request: FlowRequest, flow: Flow, usage: Usage | None, now: float
    ) -> None:
        """A dispatched request of `flow` finished at `now` with the given
        real `usage` (None: not reported)."""
        ...

    def requests(self) -> list[FlowRequest]:
        """Every queued request, in arrival order within each flow."""
        ...

    def adopt(self, flow: Flow) -> None:
        """Take over `flow`, emptied, from the band's previous policy (a
        reconfiguration): a fresh queue of this policy, and this policy's
        per-flow state reset (the previous policy may have left it set)."""
        ...


class _UsageBlind:
    """A policy that keeps no per-tenant service: a completion's usage changes nothing."""

    __slots__ = ()

    def on_complete(
        self, request: FlowRequest, flow: Flow, usage: Usage | None, now: float
    ) -> None:
        pass


class RoundRobin(_UsageBlind):
    __slots__ = ("_ordering", "_ring")

    def __init__(self, ordering: Ordering) -> None:
        self._ordering = ordering
        self._ring: deque[Flow] = deque()

    def new_queue(self) -> RequestQueue | None:
        return make_flow_queue(self._ordering)

    def push(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.push(request)
        if not flow.ring_member:
            flow.ring_member = True
            self._ring.append(flow)

    def peek(self, now: float) -> FlowRequest | None:
        ring = self._ring
        while ring:
            flow = ring[0]
            if flow.count:
                return flow.queue.head
            ring.popleft()
            flow.ring_member = False
        return None

    def take(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.pop_head()
        if flow.count:
            self._ring.rotate(-1)
        else:
            self._ring.popleft()
            flow.ring_member = False

    def discard(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.discard(request)

    def take_arrival(self, request: FlowRequest, flow: Flow) -> None:
        ring = self._ring
        if not ring:
            return
        # Only flows whose requests were all discarded stand there: `peek`
        # would drop those ahead of `flow` (every one when `push` appended
        # it) and `take` would drop `flow`.
        if flow.ring_member:
            while True:
                left = ring.popleft()
                left.ring_member = False
                if left is flow:
                    return
        for left in ring:
            left.ring_member = False
        ring.clear()

    def requests(self) -> list[FlowRequest]:
        return _flow_requests(self._ring)

    def adopt(self, flow: Flow) -> None:
        flow.reset_queue()
        flow.ring_member = False


class VirtualTokenCounter:
    __slots__ = (
        "_backlogged",
        "_floor",
        "_heap",
        "_ordering",
        "_seq",
        "input_weight",
        "output_weight",
    )

    def __init__(self, ordering: Ordering, input_weight: float, output_weight: float) -> None:
        self._ordering = ordering
        self.input_weight = input_weight
        self.output_weight = output_weight
        self._heap: list[tuple[float, int, Flow]] = []
        self._seq = 0
        self._floor = 0.0
        self._backlogged = 0

    def new_queue(self) -> RequestQueue | None:
        return make_flow_queue(self._ordering)

    def _enter(self, flow: Flow) -> None:
        """Give `flow` a fresh heap entry at its current counter; any older
        entry of the flow becomes dead (its sequence no longer matches)."""
        self._seq = seq = self._seq + 1
        flow.heap_seq = seq
        heap = self._heap
        heappush(heap, (flow.counter, seq, flow))
        if len(heap) > 2 * self._backlogged + 64:
            self._heap = [e for e in heap if e[2].count and e[1] == e[2].heap_seq]
            heapify(self._heap)

    def push(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.push(request)
        if flow.count == 1:
            floor = self._floor
            heap = self._heap
            while heap:
                counter, seq, front = heap[0]
                if front.count and seq == front.heap_seq:
                    floor = counter
                    break
                heappop(heap)
            if flow.counter < floor:
                flow.counter = floor
            self._backlogged += 1
            self._enter(flow)

    def peek(self, now: float) -> FlowRequest | None:
        heap = self._heap
        while heap:
            _, seq, flow = heap[0]
            if flow.count and seq == flow.heap_seq:
                return flow.queue.head
            heappop(heap)
        return None

    def take(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.pop_head()
        self._floor = flow.counter
        charge = self.input_weight * request.input_tokens
        request.charged_input = charge
        flow.counter += charge
        if flow.count:
            self._seq = seq = self._seq + 1
            flow.heap_seq = seq
            heapreplace(self._heap, (flow.counter, seq, flow))
        else:
            heappop(self._heap)
            self._backlogged -= 1

    def discard(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.discard(request)
        if not flow.count:
            self._backlogged -= 1

    def take_arrival(self, request: FlowRequest, flow: Flow) -> None:
        # `push`'s lift: no flow is backlogged, but an entry that `flow` kept
        # from a discard looks backlogged to it once `flow` counts a request.
        floor = self._floor
        heap = self._heap
        while heap:
            counter, seq, front = heap[0]
            if seq == front.heap_seq and (front.count or front is flow):
                floor = counter
                break
            heappop(heap)
        if flow.counter < floor:
            flow.counter = floor
        # `push` would give `flow` a new entry, and `take` pop it.
        self._seq = flow.heap_seq = self._seq + 1
        self._floor = flow.counter
        charge = self.input_weight * request.input_tokens
        request.charged_input = charge
        flow.counter += charge

    def on_complete(
        self, request: FlowRequest, flow: Flow, usage: Usage | None, now: float
    ) -> None:
        if usage is None:
            return
        charge = (
            self.output_weight * usage.output_tokens
            + self.input_weight * usage.input_tokens
            - request.charged_input
        )
        if charge:
            flow.counter += charge
            if flow.count:
                self._enter(flow)

    def requests(self) -> list[FlowRequest]:
        flows = [e[2] for e in self._heap if e[2].count and e[1] == e[2].heap_seq]
        return _flow_requests(flows)

    def adopt(self, flow: Flow) -> None:
        flow.reset_queue()
        flow.heap_seq = -1  # no live entry in this policy's heap


class GlobalStrict(_UsageBlind):
    """The flows' requests share one queue."""

    __slots__ = ("_queue",)

    def __init__(self, ordering: Ordering) -> None:
        self._queue = make_queue(ordering)

    def new_queue(self) -> None:
        return None

    def push(self, request: FlowRequest, flow: Flow) -> None:
        self._queue.push(request)

    def peek(self, now: float) -> FlowRequest | None:
        return self._queue.head

    def take(self, request: FlowRequest, flow: Flow) -> None:
        self._queue.pop_head()

    def discard(self, request: FlowRequest, flow: Flow) -> None:
        self._queue.discard(request)

    def take_arrival(self, request: FlowRequest, flow: Flow) -> None:
        pass

    def requests(self) -> list[FlowRequest]:
        return sorted(self._queue.queued(), key=lambda r: r.seq)

    def adopt(self, flow: Flow) -> None:
        flow.reset_queue()


LAS_INPUT_WEIGHT = 1
LAS_OUTPUT_WEIGHT = 2
"""The reference's weights of a token in attained service: output tokens
cost about twice input tokens."""


class _Program:
    """A program's LAS state: `service` with decay folded in up to `anchor`;
    `flow` its flow in the band (the latest one; a flow the controller
    forgot is idle, so reading it stays right)."""

    __slots__ = ("anchor", "flow", "last_completion", "service")

    def __init__(self, flow: Flow, now: float) -> None:
        self.flow = flow
        self.service = 0.0
        self.anchor = now
        self.last_completion = now
        """Seeded with when it was first seen, so a program that never
        completes still becomes evictable."""


class ProgramAware:
    __slots__ = ("_backlogged", "_config", "_next_sweep", "_ordering", "_programs")

    def __init__(self, ordering: Ordering, config: ProgramAwareConfig) -> None:
        self._ordering = ordering
        self._config = config
        self._programs: dict[str, _Program] = {}
        self._backlogged: dict[Flow, _Program] = {}
        self._next_sweep: float | None = None

    def new_queue(self) -> RequestQueue | None:
        return make_flow_queue(self._ordering)

    def _program(self, flow: Flow, now: float) -> _Program:
        program = self._programs.get(flow.fairness_id)
        if program is None:
            program = self._programs[flow.fairness_id] = _Program(flow, now)
        else:
            program.flow = flow
        return program

    def _decayed(self, program: _Program, now: float) -> float:
        half_life = self._config.half_life
        if half_life <= 0 or now <= program.anchor:
            return program.service
        return program.service * exp2((program.anchor - now) / half_life)

    def service(self, fairness_id: str, now: float) -> float | None:
        """The program's attained service at `now`, decayed; None when the
        band keeps no state for it (never seen, or evicted)."""
        program = self._programs.get(fairness_id)
        return None if program is None else self._decayed(program, now)

    def programs(self) -> int:
        """How many programs the band keeps state for."""
        return len(self._programs)

    def push(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.push(request)
        if flow.count == 1:
            self._backlogged[flow] = self._program(flow, request.arrival)

    def peek(self, now: float) -> FlowRequest | None:
        backlogged = self._backlogged
        if not backlogged:
            return None
        if self._next_sweep is None or now >= self._next_sweep:
            self._sweep(now)
        if len(backlogged) == 1:
            return next(iter(backlogged)).queue.head
        # Two flat passes: this loop is the policy's whole cost per dispatch.
        config = self._config
        half_life = config.half_life
        programs = backlogged.values()
        if half_life > 0:
            services = [
                p.service * exp2(min(0.0, (p.anchor - now) / half_life)) if p.service else 0.0
                for p in programs
            ]
        else:
            services = [p.service for p in programs]
        arrivals = [flow.queue.head.arrival for flow in backlogged]
        # wait = now - arrival, so the oldest head has the lowest arrival
        low_service = min(services)
        service_range = max(services) - low_service
        last_arrival = max(arrivals)
        arrival_range = last_arrival - min(arrivals)
        by_service = config.weight_service / service_range if service_range else 0.0
        by_wait = config.weight_head_wait / arrival_range if arrival_range else 0.0
        # range-normalized terms; a term whose values are all equal adds the
        # same 0.5 x weight to every flow, so it is left out
        scores = [
            by_wait * (last_arrival - arrival) - by_service * (service - low_service)
            for service, arrival in zip(services, arrivals, strict=True)
        ]
        best = scores.index(max(scores))  # the first best: the earliest backlogged
        return next(islice(backlogged, best, None)).queue.head

    def take(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.pop_head()
        if not flow.count:
            del self._backlogged[flow]

    def discard(self, request: FlowRequest, flow: Flow) -> None:
        flow.queue.discard(request)
        if not flow.count:
            self._backlogged.pop(flow, None)

    def take_arrival(self, request: FlowRequest, flow: Flow) -> None:
        self._program(flow, request.arrival)

    def on_complete(
        self, request: FlowRequest, flow: Flow, usage: Usage | None, now: float
    ) -> None:
        if usage is None:
            input_tokens, output_tokens = request.input_tokens, 0
        else:
            input_tokens, output_tokens = usage.input_tokens, usage.output_tokens
        program = self._program(flow, now)
        if now > program.anchor:
            program.service = self._decayed(program, now)
            program.anchor = now
        program.service += LAS_INPUT_WEIGHT * input_tokens + LAS_OUTPUT_WEIGHT * output_tokens
        program.last_completion = now
        if self._next_sweep is None or now >= self._next_sweep:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop the programs idle (nothing queued or in flight) with no
        completion for longer than the TTL; O(programs), once per sweep."""
        config = self._config
        self._next_sweep = now + config.eviction_sweep
        if config.eviction_ttl <= 0:
            return
        oldest = now - config.eviction_ttl
        programs = self._programs
        idle = [
            fairness_id
            for fairness_id, program in programs.items()
            if program.last_completion < oldest
            and not program.flow.count
            and not program.flow.in_flight
        ]
        for fairness_id in idle:
            del programs[fairness_id]

    def requests(self) -> list[FlowRequest]:
        return _flow_requests(self._backlogged)

    def adopt(self, flow: Flow) -> None:
        flow.reset_queue()


def _flow_requests(flows) -> list[FlowRequest]:
    out: list[FlowRequest] = []
    for flow in flows:
        if flow.count:
            out.extend(sorted(flow.queue.queued(), key=lambda r: r.seq))
    return out


def make_policy(config: BandConfig) -> FairnessPolicy:
    if config.fairness is Fairness.ROUND_ROBIN:
        return RoundRobin(config.ordering)
    if config.fairness is Fairness.VTC:
        return VirtualTokenCounter(config.ordering, config.input_weight, config.output_weight)
    if config.fairness is Fairness.PROGRAM_AWARE:
        return ProgramAware(config.ordering, config.program_aware)
    return GlobalStrict(config.ordering)
