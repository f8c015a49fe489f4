"""When queued requests expire, exactly, at O(1) for the common case.

Requests that take their band's TTL reach their deadlines in the order they
arrive, so each band keeps them in a lane: a deque whose deadlines never
decrease. Appending is O(1) and the lane's head is its earliest deadline.
Requests with a TTL of their own (or that arrive out of order) go to one
binary heap instead, O(log n). The next deadline is the earliest of the lane
heads and the heap top; there are as many lanes as bands, a handful.

A request that leaves its queue before its deadline is not searched for: its
entry stays and is skipped when it reaches the front. `track` sweeps all dead
entries out once the entries outnumber twice what is queued (plus
`SWEEP_SLACK`), so memory stays proportional to what is queued and no
dispatched request is kept alive long.

`Deadlines` owns its lanes, heap and entry count; the controller only hands
it each queued request with a TTL (`track`) and asks what is due.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush

from epp.flowcontrol.request import FlowRequest, State

QUEUED = State.QUEUED
SWEEP_SLACK = 1024
"""Dead entries tolerated beyond twice the queued requests."""


class Deadlines:
    __slots__ = ("_heap", "_lanes", "entries")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, FlowRequest]] = []
        self._lanes: list[deque[FlowRequest]] = []
        self.entries = 0
        """Entries in lanes and heap, dead or alive."""

    def new_lane(self) -> deque[FlowRequest]:
        lane: deque[FlowRequest] = deque()
        self._lanes.append(lane)
        return lane

    def drop_lane(self, lane: deque[FlowRequest]) -> None:
        """Forget a lane whose requests have all left their queues."""
        self._lanes = [kept for kept in self._lanes if kept is not lane]
        self.entries -= len(lane)

    def track(self, request: FlowRequest, lane: deque[FlowRequest] | None, queued: int) -> None:
        """Track `request.deadline`: in `lane` (its band's, given when the
        request takes the band's TTL) if the lane's last deadline is not
        later, else in the heap. `queued`: how many requests are queued, to
        know when dead entries are worth a sweep."""
        deadline = request.deadline
        if lane is not None and (not lane or lane[-1].deadline <= deadline):
            lane.append(request)
        else:
            heappush(self._heap, (deadline, request.seq, request))
        self.entries += 1
        if self.entries > 2 * queued + SWEEP_SLACK:
            self.sweep()

    def pop_due(self, now: float) -> list[FlowRequest]:
        """Remove and return the queued requests whose deadline is at or
        before `now`, earliest first within each lane and the heap."""
        due: list[FlowRequest] = []
        for lane in self._lanes:
            while lane and lane[0].deadline <= now:
                request = lane.popleft()
                self.entries -= 1
                if request.state is QUEUED:
                    due.append(request)
        heap = self._heap
        while heap and heap[0][0] <= now:
            request = heappop(heap)[2]
            self.entries -= 1
            if request.state is QUEUED:
                due.append(request)
        return due

    def next(self) -> float | None:
        """The earliest deadline of a queued request, or None."""
        best: float | None = None
        for lane in self._lanes:
            while lane and lane[0].state is not QUEUED:
                lane.popleft()
                self.entries -= 1
            if lane and (best is None or lane[0].deadline < best):
                best = lane[0].deadline
        heap = self._heap
        while heap and heap[0][2].state is not QUEUED:
            heappop(heap)
            self.entries -= 1
        if heap and (best is None or heap[0][0] < best):
            best = heap[0][0]
        return best

    def clear(self) -> None:
        """Forget every entry (the lanes stay, empty): the requests are
        about to be tracked again with new deadlines."""
        for lane in self._lanes:
            lane.clear()
        self._heap = []
        self.entries = 0

    def sweep(self) -> None:
        """Drop every dead entry."""
        for lane in self._lanes:
            live = [r for r in lane if r.state is QUEUED]
            lane.clear()
            lane.extend(live)
        self._heap = [e for e in self._heap if e[2].state is QUEUED]
        heapify(self._heap)
        self.entries = sum(map(len, self._lanes)) + len(self._heap)
