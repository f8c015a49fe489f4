"""Ordering inside a queue: which queued request goes first.

- `fcfs`: arrival order. A doubly linked list threaded through the requests
  themselves (`prev`/`next`), so a queue costs two pointers, however many
  flows there are, and push, pop and removal from the middle are all O(1).
- `edf`: earliest deadline first, deadline = arrival + effective TTL. Requests
  without a deadline go after all that have one, in arrival order.
- `slo-deadline`: earliest TTFT target first, target = arrival + the request's
  `x-llm-d-slo-ttft-ms`; requests without one fall back to their TTL deadline.

Both deadline orders are binary heaps keyed by (deadline, arrival sequence):
O(log n) push and pop, FCFS among equal deadlines. Removal from the middle is
lazy there: the removed request's entry stays until it reaches the top or
until the dead outnumber the living, when the heap is rebuilt without them.

Every queue keeps `head`, the request that goes next (None when empty), as a
plain attribute, so that looking at it costs no call.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Protocol

from epp.flowcontrol.config import Ordering
from epp.flowcontrol.request import FlowRequest, State

QUEUED = State.QUEUED
_COMPACT_MIN_DEAD = 64


class RequestQueue(Protocol):
    head: FlowRequest | None
    """The request that goes next, or None when the queue is empty."""

    def push(self, request: FlowRequest) -> None: ...

    def pop_head(self) -> FlowRequest:
        """Remove and return `head`; call only when there is one."""
        ...

    def discard(self, request: FlowRequest) -> None:
        """Remove `request`, which has left the queue (its state is no longer
        QUEUED)."""
        ...

    def queued(self) -> list[FlowRequest]:
        """The requests in the queue, in no particular order."""
        ...


class FifoQueue:
    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head: FlowRequest | None = None
        self.tail: FlowRequest | None = None

    def push(self, request: FlowRequest) -> None:
        tail = self.tail
        if tail is None:
            self.head = request
        else:
            tail.next = request
            request.prev = tail
        self.tail = request

    def pop_head(self) -> FlowRequest:
        # The head's `prev` is always None. Clearing `following.prev` costs no
        # cache miss: making it the head touches its first line anyway.
        head = self.head
        following = head.next
        self.head = following
        if following is None:
            self.tail = None
        else:
            following.prev = None
            head.next = None
        return head

    def discard(self, request: FlowRequest) -> None:
        after = request.next
        if request is self.head:
            self.head = after
            if after is None:
                self.tail = None
            else:
                after.prev = None
        else:
            before = request.prev
            before.next = after
            if after is None:
                self.tail = before
            else:
                after.prev = before
        request.prev = request.next = None

    def queued(self) -> list[FlowRequest]:
        out = []
        request = self.head
        while request is not None:
            out.append(request)
            request = request.next
        return out


class DeadlineQueue:
    """A heap ordered by `request.order_key`, then arrival sequence. Its top
    entry is always a queued request, so `head` is exact."""

    __slots__ = ("_dead", "_items", "head")

    def __init__(self) -> None:
        self._items: list[tuple[float, int, FlowRequest]] = []
        self._dead = 0
        self.head: FlowRequest | None = None

    def push(self, request: FlowRequest) -> None:
        heappush(self._items, (request.order_key, request.seq, request))
        self.head = self._items[0][2]

    def pop_head(self) -> FlowRequest:
        request = heappop(self._items)[2]
        self._settle()
        return request

    def discard(self, request: FlowRequest) -> None:
        self._dead += 1
        if self._dead > _COMPACT_MIN_DEAD and self._dead * 2 > len(self._items):
            self._items = [e for e in self._items if e[2].state is QUEUED]
            heapify(self._items)
            self._dead = 0
        self._settle()

    def _settle(self) -> None:
        items = self._items
        while items and items[0][2].state is not QUEUED:
            heappop(items)
            self._dead -= 1
        self.head = items[0][2] if items else None

    def queued(self) -> list[FlowRequest]:
        return [e[2] for e in self._items if e[2].state is QUEUED]


def make_queue(ordering: Ordering) -> RequestQueue:
    return FifoQueue() if ordering is Ordering.FCFS else DeadlineQueue()


def make_flow_queue(ordering: Ordering) -> RequestQueue | None:
    """A flow's queue for `ordering`; None for FCFS, where the flow is its own
    queue (see `epp.flowcontrol.flow.Flow`)."""
    return None if ordering is Ordering.FCFS else DeadlineQueue()


def order_key(ordering: Ordering, request: FlowRequest) -> float:
    """The heap key of `request` under `ordering` (unused by FCFS)."""
    if ordering is Ordering.SLO_DEADLINE and request.ttft_slo is not None:
        return request.arrival + request.ttft_slo
    return request.deadline
