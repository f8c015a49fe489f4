"""A flow: the requests of one tenant (fairness id) in one priority band."""

from __future__ import annotations

from typing import NamedTuple

from epp.flowcontrol.ordering import RequestQueue


class FlowKey(NamedTuple):
    fairness_id: str
    priority: int


class Flow:
    """Counters are exact at all times: `count` and `bytes` cover the queued
    requests, `in_flight` the dispatched ones not yet completed. The fairness
    policy keeps its own state here (`counter`, `ring_member`, `heap_seq`)."""

    __slots__ = (
        "bytes",
        "count",
        "counter",
        "fairness_id",
        "heap_seq",
        "idle_since",
        "idle_tracked",
        "in_flight",
        "priority",
        "queue",
        "ring_member",
    )

    def __init__(self, fairness_id: str, priority: int, queue: RequestQueue | None) -> None:
        self.fairness_id = fairness_id
        self.priority = priority
        self.queue = queue
        self.count = 0
        self.bytes = 0
        self.in_flight = 0
        self.counter = 0.0
        self.ring_member = False
        self.heap_seq = -1
        self.idle_since = 0.0
        self.idle_tracked = False

    @property
    def key(self) -> FlowKey:
        return FlowKey(self.fairness_id, self.priority)

    @property
    def is_idle(self) -> bool:
        return self.count == 0 and self.in_flight == 0

    def __repr__(self) -> str:
        return f"Flow({self.fairness_id!r}, {self.priority}, count={self.count})"
