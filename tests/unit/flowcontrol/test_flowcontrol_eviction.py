"""In-flight eviction: which request is evicted, for whom, and how often."""

from __future__ import annotations

import asyncio

from epp.config.loader import parse_config
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import Evictor, PriorityThenTime, SheddableFilter
from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.serve.admission import AdmissionController
from tests.support.placers import LeastLoadedPlacer

HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def request(name: str, priority: int) -> FlowRequest:
    return FlowRequest(name, "f", priority, 0.0)


def evictor() -> Evictor:
    return Evictor(SheddableFilter(), PriorityThenTime())


def test_enable_eviction_builds_the_references_two_plugins() -> None:
    config = parse_config({**HEAD, "flowControl": {"enableEviction": True}})
    assert config.flow_plugins.eviction == (SheddableFilter(), PriorityThenTime())


def test_eviction_is_off_by_default() -> None:
    assert parse_config({**HEAD}).flow_plugins.eviction is None


def test_only_sheddable_requests_are_evictable() -> None:
    assert SheddableFilter().evictable(request("a", -1))
    assert not SheddableFilter().evictable(request("b", 0))


def test_the_lowest_priority_goes_first_then_the_newest() -> None:
    old_low, mid, new_low = request("old", -5), request("mid", -1), request("new", -5)
    assert PriorityThenTime().victim([old_low, mid, new_low]) is new_low


def test_a_victim_must_be_of_a_strictly_lower_priority() -> None:
    chooser = evictor()
    chooser.on_dispatched(request("a", -1))
    assert chooser.victim_for(-1) is None


def test_no_second_eviction_before_the_first_is_confirmed() -> None:
    chooser = evictor()
    first, second = request("a", -1), request("b", -1)
    chooser.on_dispatched(first)
    chooser.on_dispatched(second)
    assert chooser.victim_for(0) is second
    assert chooser.victim_for(0) is None
    chooser.on_completed(second)
    assert chooser.victim_for(0) is first


def test_a_completed_request_is_no_longer_a_candidate() -> None:
    chooser = evictor()
    done = request("a", -1)
    chooser.on_dispatched(done)
    chooser.on_completed(done)
    assert chooser.victim_for(0) is None


class OneSlotPool:
    """One endpoint, one credit, eviction on; `evicted` lists what the
    admission asked the shell to end."""

    def __init__(self) -> None:
        self.gate = ConcurrencyGate(max_in_flight=1)
        self.core = FlowController(
            FlowControlConfig(), self.gate, LeastLoadedPlacer(lambda: ["e:1"], self.gate)
        )
        self.evicted: list[FlowRequest] = []
        self.admission = AdmissionController(
            self.core, evictor=evictor(), on_evict=self.evicted.append
        )


async def test_a_waiting_higher_band_evicts_the_sheddable_request_in_flight() -> None:
    pool = OneSlotPool()
    sheddable, urgent = request("s", -1), request("u", 5)
    assert pool.admission.offer(sheddable) is Outcome.DISPATCHED
    assert pool.admission.offer(urgent) is None
    assert pool.evicted == [sheddable]


async def test_the_evicted_requests_credit_goes_to_the_waiting_request_once() -> None:
    pool = OneSlotPool()
    sheddable, urgent = request("s", -1), request("u", 5)
    pool.admission.offer(sheddable)
    waiting = asyncio.ensure_future(pool.admission.admit(urgent))
    await asyncio.sleep(0)
    pool.admission.complete(sheddable)  # the evicted stream ended
    assert await waiting is Outcome.DISPATCHED
    pool.admission.complete(sheddable)  # a second end changes nothing
    assert pool.gate.in_flight == 1 and pool.core.in_flight == 1


async def test_a_waiting_band_of_the_same_priority_evicts_nothing() -> None:
    pool = OneSlotPool()
    pool.admission.offer(request("a", -1))
    pool.admission.offer(request("b", -1))
    assert pool.evicted == []


async def test_without_an_evictor_nothing_is_evicted() -> None:
    gate = ConcurrencyGate(max_in_flight=1)
    core = FlowController(FlowControlConfig(), gate, LeastLoadedPlacer(lambda: ["e:1"], gate))
    evicted: list[FlowRequest] = []
    admission = AdmissionController(core, on_evict=evicted.append)
    admission.offer(request("s", -1))
    admission.offer(request("u", 5))
    assert evicted == []
