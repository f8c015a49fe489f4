"""A flow: the requests of one tenant (fairness id) in one priority band."""

from __future__ import annotations

from typing import NamedTuple

from epp.flowcontrol.ordering import FifoQueue, RequestQueue


class FlowKey(NamedTuple):
    fairness_id: str
    priority: int


class Flow(FifoQueue):
    """Counters are exact at all times: `count` and `bytes` cover the queued
    requests, `in_flight` the dispatched ones not yet completed. The fairness
    policy keeps its own state here (`counter`, `ring_member`, `heap_seq`).

    A flow is a FIFO queue itself: under `fcfs` its `queue` is the flow, so
    the policy reaches the head request without touching another object (with
    100k flows, every object touched per dispatch is a likely cache miss).
    Under a deadline ordering `queue` is a heap of its own."""

    __slots__ = (  # noqa: RUF023 - hot fields first: they share the object's first cache line
        "queue",
        "count",
        "bytes",
        "ring_member",
        "in_flight",
        "counter",
        "heap_seq",
        "fairness_id",
        "priority",
        "idle_since",
        "idle_tracked",
    )

    def __init__(self, fairness_id: str, priority: int, queue: RequestQueue | None) -> None:
        self.fairness_id = fairness_id
        self.priority = priority
        self.reset_queue(queue)
        self.count = 0
        self.bytes = 0
        self.in_flight = 0
        self.counter = 0.0
        self.ring_member = False
        self.heap_seq = -1
        self.idle_since = 0.0
        self.idle_tracked = False

    def reset_queue(self, queue: RequestQueue | None) -> None:
        """Start over with an empty queue: `queue`, or the flow itself when None."""
        self.head = self.tail = None
        self.queue: RequestQueue = self if queue is None else queue

    @property
    def key(self) -> FlowKey:
        return FlowKey(self.fairness_id, self.priority)

    @property
    def is_idle(self) -> bool:
        return self.count == 0 and self.in_flight == 0

    def __repr__(self) -> str:
        return f"Flow({self.fairness_id!r}, {self.priority}, count={self.count})"
