"""Small real gates, placers and builders shared by the flow-control tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from math import inf

from epp.flowcontrol.config import BandConfig, FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import Placement
from epp.flowcontrol.request import FlowRequest

ENDPOINT = "10.0.0.1:8000"
_ids = itertools.count()


class Credits:
    """A gate that lets `credits` more dispatches through; completions give
    nothing back. `credits` may be changed between passes. `observe`, if
    given, is told of each dispatch as it happens."""

    def __init__(
        self, credits: float = inf, observe: Callable[[FlowRequest], None] | None = None
    ) -> None:
        self.credits = credits
        self.observe = observe
        self.dispatched: list[FlowRequest] = []
        self.completed: list[FlowRequest] = []

    def is_open(self, priority: int) -> bool:
        return self.credits > 0

    def on_dispatch(self, request: FlowRequest) -> None:
        self.credits -= 1
        self.dispatched.append(request)
        if self.observe is not None:
            self.observe(request)

    def on_complete(self, request: FlowRequest) -> None:
        self.completed.append(request)


class Placer:
    """Places every request on `ENDPOINT`, unless `decide` says otherwise."""

    def __init__(
        self,
        decide: Callable[[FlowRequest], Placement] | None = None,
        endpoints: bool = True,
    ) -> None:
        self.decide = decide
        self.endpoints = endpoints

    def place(self, request: FlowRequest) -> Placement:
        return ENDPOINT if self.decide is None else self.decide(request)

    def has_endpoints(self) -> bool:
        return self.endpoints


def request(
    fairness_id: str = "tenant-a", priority: int = 0, arrival: float = 0.0, **fields
) -> FlowRequest:
    return FlowRequest(
        request_id=f"r{next(_ids)}",
        fairness_id=fairness_id,
        priority=priority,
        arrival=arrival,
        **fields,
    )


def controller(
    *bands: BandConfig,
    gate=None,
    placer=None,
    default_band: BandConfig | None = None,
    **config,
) -> FlowController:
    if default_band is not None:
        config["default_band"] = default_band
    return FlowController(
        FlowControlConfig(bands=bands, **config),
        gate if gate is not None else Credits(),
        placer if placer is not None else Placer(),
    )


def enqueue_all(core: FlowController, *requests: FlowRequest, now: float = 0.0) -> None:
    for r in requests:
        assert core.enqueue(r, now) is None, r


def dispatch_one(core: FlowController, now: float = 0.0) -> FlowRequest:
    """Dispatch exactly one request by giving the gate exactly one credit."""
    gate = core.gate
    gate.credits = 1
    done = core.dispatch(now)
    gate.credits = 0
    assert len(done) == 1, done
    return done[0]


def tenants(requests: list[FlowRequest]) -> list[str]:
    return [r.fairness_id for r in requests]


def collected(core: FlowController, now: float) -> list[FlowKey]:
    """The idle flows a `poke` at `now` forgets, as told to `on_flows_collected`."""
    keys: list[FlowKey] = []
    core.on_flows_collected = keys.extend
    core.poke(now)
    core.on_flows_collected = None
    return keys
