"""Ordering inside a queue: which queued request goes first.

- `fcfs`: arrival order. A deque: push and pop are O(1).
- `edf`: earliest deadline first, deadline = arrival + effective TTL. Requests
  without a deadline go after all that have one, in arrival order.
- `slo-deadline`: earliest TTFT target first, target = arrival + the request's
  `x-llm-d-slo-ttft-ms`; requests without one fall back to their TTL deadline.

Both deadline orders are binary heaps keyed by (deadline, arrival sequence):
O(log n) push and pop, FCFS among equal deadlines.

Removal of a request from the middle (its client went away, its TTL passed) is
lazy: the caller marks the request as no longer queued and tells the queue,
which counts it as dead and skips it when it reaches the head. When the dead
outnumber the living, the queue is rebuilt without them, so memory stays
proportional to what is queued and every operation stays amortised O(1) or
O(log n).
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from typing import Protocol

from epp.flowcontrol.config import Ordering
from epp.flowcontrol.request import FlowRequest, State

QUEUED = State.QUEUED
_COMPACT_MIN_DEAD = 64


class RequestQueue(Protocol):
    def push(self, request: FlowRequest) -> None: ...

    def peek(self) -> FlowRequest | None:
        """The head among the requests still queued, or None."""
        ...

    def pop_head(self) -> FlowRequest:
        """Remove and return the head; call only right after `peek` found one."""
        ...

    def discard(self, request: FlowRequest) -> None:
        """`request` left the queue (its state is no longer QUEUED)."""
        ...

    def queued(self) -> list[FlowRequest]:
        """The requests still queued, in no particular order."""
        ...


class FifoQueue(deque):
    """A deque, so that push and pop are the deque's own C methods."""

    __slots__ = ("dead",)

    push = deque.append
    pop_head = deque.popleft

    def __init__(self) -> None:
        super().__init__()
        self.dead = 0

    def peek(self) -> FlowRequest | None:
        while self:
            head = self[0]
            if head.state is QUEUED:
                return head
            self.popleft()
            self.dead -= 1
        return None

    def discard(self, request: FlowRequest) -> None:
        self.dead += 1
        if self.dead > _COMPACT_MIN_DEAD and self.dead * 2 > len(self):
            live = self.queued()
            self.clear()
            self.extend(live)
            self.dead = 0

    def queued(self) -> list[FlowRequest]:
        return [r for r in self if r.state is QUEUED]


class DeadlineQueue:
    """A heap ordered by `request.order_key`, then arrival sequence."""

    __slots__ = ("_dead", "_items")

    def __init__(self) -> None:
        self._items: list[tuple[float, int, FlowRequest]] = []
        self._dead = 0

    def push(self, request: FlowRequest) -> None:
        heappush(self._items, (request.order_key, request.seq, request))

    def peek(self) -> FlowRequest | None:
        items = self._items
        while items:
            head = items[0][2]
            if head.state is QUEUED:
                return head
            heappop(items)
            self._dead -= 1
        return None

    def pop_head(self) -> FlowRequest:
        return heappop(self._items)[2]

    def discard(self, request: FlowRequest) -> None:
        self._dead += 1
        if self._dead > _COMPACT_MIN_DEAD and self._dead * 2 > len(self._items):
            self._items = [e for e in self._items if e[2].state is QUEUED]
            heapify(self._items)
            self._dead = 0

    def queued(self) -> list[FlowRequest]:
        return [e[2] for e in self._items if e[2].state is QUEUED]


def make_queue(ordering: Ordering) -> RequestQueue:
    return FifoQueue() if ordering is Ordering.FCFS else DeadlineQueue()


def order_key(ordering: Ordering, request: FlowRequest) -> float:
    """The heap key of `request` under `ordering` (unused by FCFS)."""
    if ordering is Ordering.SLO_DEADLINE and request.ttft_slo is not None:
        return request.arrival + request.ttft_slo
    return request.deadline
