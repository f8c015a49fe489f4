"""The flow-control core's plug points for pool capacity and endpoint choice.

The core asks a `Gate` whether a band may dispatch now, and a `Placer` where
the chosen request goes. It tells the gate about every dispatch and every
completion, so a gate that counts in-flight requests is exact at all times,
not one scrape interval behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest

Placement = str | Outcome | None
"""An endpoint address ("ip:port") to dispatch to; None when no endpoint has
room now (the request stays at the head of its queue); or an Outcome that ends
the request at once (for example an endpoint subset that matches nothing)."""


def count_out(in_flight: dict[str, int], endpoint: str) -> None:
    """One request fewer in flight at `endpoint`, in a gate's per-endpoint
    count: an endpoint leaves the map at zero, so the map holds only the
    endpoints with requests in flight and does not grow with every endpoint
    the pool ever had."""
    left = in_flight[endpoint] - 1
    if left:
        in_flight[endpoint] = left
    else:
        del in_flight[endpoint]


class Gate(Protocol):
    def is_open(self, priority: int) -> bool:
        """Whether a request of band `priority` may be dispatched now."""
        ...

    def on_dispatch(self, request: FlowRequest) -> None:
        """`request` was dispatched to `request.endpoint`."""
        ...

    def on_complete(self, request: FlowRequest) -> None:
        """`request`, dispatched earlier, no longer holds its endpoint."""
        ...


class Placer(Protocol):
    def place(self, request: FlowRequest) -> Placement:
        """Choose the endpoint for `request`; see `Placement`."""
        ...

    def has_endpoints(self) -> bool:
        """Whether the pool has any endpoint at all."""
        ...


class Addressed(Protocol):
    @property
    def address(self) -> str: ...


E = TypeVar("E", bound=Addressed)


class Credits(Protocol):
    """Per-endpoint in-flight credits, which the scheduler respects."""

    def has_room(self, endpoint: str, priority: int = 0) -> bool:
        """Whether a request of band `priority` may go to `endpoint` now."""
        ...

    def with_room(self, endpoints: Sequence[E], priority: int = 0) -> Sequence[E]:
        """The `endpoints` (anything with an `address`) that have room for
        band `priority` now."""
        ...

    def may_have_room(self, endpoints: Sequence[Addressed], priority: int = 0) -> bool:
        """False only when `with_room(endpoints, priority)` would surely
        find none (asked before any scoring, so it must be cheap; True
        when unsure)."""
        ...


class OpenGate:
    """A gate that never closes."""

    def is_open(self, priority: int) -> bool:
        return True

    def on_dispatch(self, request: FlowRequest) -> None:
        pass

    def on_complete(self, request: FlowRequest) -> None:
        pass


class ConcurrencyGate:
    """In-flight credits for the whole pool and for each endpoint.

    `max_in_flight` of 0 leaves the pool unlimited; `max_per_endpoint` of 0
    leaves endpoints unlimited. Counts change at dispatch and completion, so
    the gate never lets more requests through than it has credits for.
    """

    __slots__ = ("_per_endpoint", "in_flight", "max_in_flight", "max_per_endpoint")

    def __init__(self, max_in_flight: int = 0, max_per_endpoint: int = 0) -> None:
        self.max_in_flight = max_in_flight
        self.max_per_endpoint = max_per_endpoint
        self.in_flight = 0
        self._per_endpoint: dict[str, int] = {}

    def is_open(self, priority: int) -> bool:
        return self.max_in_flight <= 0 or self.in_flight < self.max_in_flight

    def has_room(self, endpoint: str, priority: int = 0) -> bool:
        return self.max_per_endpoint <= 0 or (
            self._per_endpoint.get(endpoint, 0) < self.max_per_endpoint
        )

    def with_room(self, endpoints: Sequence[E], priority: int = 0) -> Sequence[E]:
        limit = self.max_per_endpoint
        if limit <= 0 or self.in_flight < limit:
            return endpoints  # fewer in flight than one endpoint's limit: none is full
        per_endpoint = self._per_endpoint
        return [e for e in endpoints if per_endpoint.get(e.address, 0) < limit]

    def may_have_room(self, endpoints: Sequence[Addressed], priority: int = 0) -> bool:
        return True

    def in_flight_at(self, endpoint: str) -> int:
        return self._per_endpoint.get(endpoint, 0)

    def on_dispatch(self, request: FlowRequest) -> None:
        self.in_flight += 1
        endpoint = request.endpoint
        if endpoint is not None:
            self._per_endpoint[endpoint] = self._per_endpoint.get(endpoint, 0) + 1

    def on_complete(self, request: FlowRequest) -> None:
        self.in_flight -= 1
        endpoint = request.endpoint
        if endpoint is not None:
            count_out(self._per_endpoint, endpoint)


def gate_parts(gate: Gate) -> tuple[Gate, ...]:
    """The gates `gate` is made of: its members if it is `AllGates`, else itself."""
    return gate.gates if isinstance(gate, AllGates) else (gate,)


class AllGates:
    """Open only when every gate is open; tells each of them everything."""

    __slots__ = ("gates",)

    def __init__(self, gates: Iterable[Gate]) -> None:
        self.gates = tuple(gates)

    def is_open(self, priority: int) -> bool:
        return all(gate.is_open(priority) for gate in self.gates)

    def on_dispatch(self, request: FlowRequest) -> None:
        for gate in self.gates:
            gate.on_dispatch(request)

    def on_complete(self, request: FlowRequest) -> None:
        for gate in self.gates:
            gate.on_complete(request)
