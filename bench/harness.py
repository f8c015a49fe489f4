"""Shared set-up for the queue-core benchmarks: a controller pre-filled to a
given depth, and a gate that lets exactly as many requests through as it is
given credits, so that one enqueue and one dispatch make a steady-state pair."""

from __future__ import annotations

import random
from dataclasses import dataclass

from epp.flowcontrol.config import BandConfig, Fairness, FlowControlConfig, Ordering
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.request import FlowRequest

ENDPOINT = "10.0.0.1:8000"


class CreditGate:
    """Open while it holds credits; each dispatch spends one."""

    __slots__ = ("credits",)

    def __init__(self) -> None:
        self.credits = 0

    def is_open(self, priority: int) -> bool:
        return self.credits > 0

    def on_dispatch(self, request: FlowRequest) -> None:
        self.credits -= 1

    def on_complete(self, request: FlowRequest) -> None:
        pass


class OnePlacer:
    """Every request goes to the same endpoint."""

    def place(self, request: FlowRequest) -> str:
        return ENDPOINT

    def has_endpoints(self) -> bool:
        return True


@dataclass(slots=True)
class Setup:
    """`flows` counts flows in all bands together: tenant i always sends to
    band i % bands, as a tenant with one objective does."""

    queued: int
    flows: int
    bands: int = 8
    fairness: Fairness = Fairness.ROUND_ROBIN
    ordering: Ordering = Ordering.FCFS
    seed: int = 1


class RequestFactory:
    def __init__(self, setup: Setup) -> None:
        self._rng = random.Random(setup.seed)
        self._tenants = [(f"tenant-{i}", i % setup.bands) for i in range(setup.flows)]
        self._n = 0

    def make(self, now: float) -> FlowRequest:
        """A request of a random tenant; the first `flows` requests go to
        each tenant once, so that every flow exists from the start (a steady
        state, not the first appearance of tenants, is what is measured)."""
        rng = self._rng
        self._n += 1
        tenants = self._tenants
        if self._n <= len(tenants):
            fairness_id, priority = tenants[self._n - 1]
        else:
            fairness_id, priority = rng.choice(tenants)
        return FlowRequest(
            request_id=f"req-{self._n}",
            fairness_id=fairness_id,
            priority=priority,
            arrival=now,
            byte_size=1024,
            input_tokens=rng.randrange(16, 2048),
        )

    def batch(self, count: int, now: float) -> list[FlowRequest]:
        return [self.make(now) for _ in range(count)]


def build(setup: Setup) -> tuple[FlowController, CreditGate, RequestFactory]:
    band = BandConfig(
        priority=0,
        max_requests=0,
        max_bytes=0,
        fairness=setup.fairness,
        ordering=setup.ordering,
    )
    config = FlowControlConfig(default_band=band, default_ttl=3600.0)
    gate = CreditGate()
    controller = FlowController(config, gate, OnePlacer())
    factory = RequestFactory(setup)
    for request in factory.batch(setup.queued, 0.0):
        controller.enqueue(request, 0.0)
    return controller, gate, factory
