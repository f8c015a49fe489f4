"""In-flight eviction (`flowControl.enableEviction`): a dispatched sheddable
request gives its endpoint back to a higher band that cannot dispatch.

The reference's plugins: `sheddable-eviction-filter` (only requests with
priority < 0 may be evicted) and `priority-then-time-eviction-order-policy`
(the lowest priority first, the most recently dispatched first within it).
`Evictor` keeps the dispatched requests in dispatch order and, after a
dispatch pass that left a band waiting, names one victim of a strictly lower
priority. Like the reference's reclamation controller it acts again only
once every eviction it asked for is confirmed (the victim's stream ended and
its credit came back), so it never acts twice on a pool that has not yet
absorbed the first. The core (`epp.scheduling.core.Core`) holds it and
hands the victim to the shell, which ends it (live: 429, dropped reason
`evicted`; the simulator: outcome `evicted`); its completion is an ordinary
one, so the credit is returned exactly once. Cost: O(1) per dispatch and
completion, O(in flight) per eviction decision, which runs only while a
band waits and nothing is outstanding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.flowcontrol.request import FlowRequest


@dataclass(slots=True, frozen=True)
class SheddableFilter:
    """`sheddable-eviction-filter`."""

    def evictable(self, request: FlowRequest) -> bool:
        return request.priority < 0


@dataclass(slots=True, frozen=True)
class PriorityThenTime:
    """`priority-then-time-eviction-order-policy`."""

    def victim(self, candidates: Sequence[FlowRequest]) -> FlowRequest | None:
        """The first victim of `candidates` (given in dispatch order)."""
        best: FlowRequest | None = None
        for request in candidates:  # later dispatch wins a tie: >= keeps the newest
            if best is None or request.priority <= best.priority:
                best = request
        return best


class Evictor:
    __slots__ = ("_in_flight", "_outstanding", "filter", "order")

    def __init__(self, filter: SheddableFilter, order: PriorityThenTime) -> None:
        self.filter = filter
        self.order = order
        self._in_flight: dict[FlowRequest, None] = {}
        """Dispatched requests that may be evicted, oldest dispatch first."""
        self._outstanding: set[FlowRequest] = set()

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def on_dispatched(self, request: FlowRequest) -> None:
        if self.filter.evictable(request):
            self._in_flight[request] = None

    def on_completed(self, request: FlowRequest) -> None:
        self._in_flight.pop(request, None)
        self._outstanding.discard(request)

    def victim_for(self, blocked_priority: int) -> FlowRequest | None:
        """The request to evict for a waiting band of `blocked_priority`
        (None: nothing of a lower priority, or an eviction not yet confirmed)."""
        if self._outstanding or not self._in_flight:
            return None
        candidates = [r for r in self._in_flight if r.priority < blocked_priority]
        victim = self.order.victim(candidates)
        if victim is not None:
            del self._in_flight[victim]
            self._outstanding.add(victim)
        return victim
