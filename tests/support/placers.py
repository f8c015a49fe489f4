"""A placer for flow-control tests: the least-loaded endpoint with room.

The production placer is the scheduler (`epp.scheduling.scheduler`); this one
keeps flow-control tests independent of scoring.
"""

from __future__ import annotations

from collections.abc import Callable

from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.request import FlowRequest


class LeastLoadedPlacer:
    """The simplest useful placer: the endpoint with the fewest in-flight
    requests that still has room in `gate`; ties go to the first listed.

    """

    __slots__ = ("_endpoints", "_gate")

    def __init__(self, endpoints: Callable[[], list[str]], gate: ConcurrencyGate) -> None:
        self._endpoints = endpoints
        self._gate = gate

    def place(self, request: FlowRequest) -> str | None:
        best: str | None = None
        best_load = 0
        gate = self._gate
        for endpoint in self._endpoints():
            if not gate.has_room(endpoint):
                continue
            load = gate.in_flight_at(endpoint)
            if best is None or load < best_load:
                best, best_load = endpoint, load
        return best

    def has_endpoints(self) -> bool:
        return bool(self._endpoints())
