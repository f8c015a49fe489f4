"""A flow: the requests of one tenant (fairness id) in one priority band."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from epp.flowcontrol.ordering import FifoQueue, RequestQueue

if TYPE_CHECKING:
    from epp.flowcontrol.band import Band


class FlowKey(NamedTuple):
    fairness_id: str
    priority: int


class FlowHead(FifoQueue):
    """The slots of a flow that round-robin touches per enqueue and dispatch:
    with FifoQueue's `head` and `tail` they fill the flow's first cache line.

    CPython lays out a class's own slots in the order of their names, after
    those of its bases, so only a base class can put these ahead of the
    others. With the six slots of `Flow` a flow is a 128-byte block (GC header
    included), so every flow starts on a line."""

    __slots__ = ("count", "in_flight", "queue", "ring_member")


class Flow(FlowHead):
    """Counters are exact at all times: `count` covers the queued requests,
    `in_flight` the dispatched ones not yet completed; the controller writes
    them (bytes are counted per band, `Band.bytes`). The fairness policy keeps
    its own state here (`counter`, `ring_member`, `heap_seq`) and is the only
    writer of it.

    A flow is a FIFO queue itself: under `fcfs` its `queue` is the flow, so
    the policy reaches the head request without touching another object (with
    100k flows, every object touched per dispatch is a likely cache miss).
    Under a deadline ordering `queue` is a heap of its own."""

    __slots__ = (
        "band",
        "counter",
        "fairness_id",
        "heap_seq",
        "idle_since",
    )

    def __init__(self, fairness_id: str, band: Band) -> None:
        self.fairness_id = fairness_id
        self.band = band
        self.reset_queue()
        self.count = 0
        self.in_flight = 0
        self.counter = 0.0
        self.ring_member = False
        self.heap_seq = -1
        self.idle_since: float | None = None
        """When the flow last fell idle, while it has an entry in the
        controller's idle heap; None: no entry."""

    def reset_queue(self) -> None:
        """Start over with an empty queue of the band's policy: its own, or the
        flow itself when the policy gives none."""
        self.head = self.tail = None
        queue = self.band.policy.new_queue()
        self.queue: RequestQueue = self if queue is None else queue

    @property
    def priority(self) -> int:
        return self.band.priority

    @property
    def key(self) -> FlowKey:
        return FlowKey(self.fairness_id, self.priority)

    @property
    def is_idle(self) -> bool:
        return self.count == 0 and self.in_flight == 0

    def __repr__(self) -> str:
        return f"Flow({self.fairness_id!r}, {self.priority}, count={self.count})"
