"""In-flight eviction: which request is evicted, for whom, and how often."""

from __future__ import annotations

from epp.config.loader import parse_config
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import Evictor, PriorityThenTime, SheddableFilter
from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.core import Core
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
    """One endpoint, one credit, eviction on; `evicted` lists what the core
    asked the shell to end."""

    def __init__(self) -> None:
        self.gate = ConcurrencyGate(max_in_flight=1)
        self.controller = FlowController(
            FlowControlConfig(), self.gate, LeastLoadedPlacer(lambda: ["e:1"], self.gate)
        )
        self.evicted: list[FlowRequest] = []
        self.core = Core(self.controller, evictor=evictor(), on_evict=self.evicted.append)


def test_a_waiting_higher_band_evicts_the_sheddable_request_in_flight() -> None:
    pool = OneSlotPool()
    sheddable, urgent = request("s", -1), request("u", 5)
    assert pool.core.arrive(sheddable, 0.0) == (None, [sheddable])
    assert pool.core.arrive(urgent, 0.0) == (None, [])
    assert pool.evicted == [sheddable]


def test_the_evicted_requests_credit_goes_to_the_waiting_request_once() -> None:
    pool = OneSlotPool()
    sheddable, urgent = request("s", -1), request("u", 5)
    pool.core.arrive(sheddable, 0.0)
    pool.core.arrive(urgent, 0.0)
    assert pool.core.complete(sheddable, 1.0) == [urgent]  # the evicted stream ended
    assert urgent.outcome is Outcome.DISPATCHED
    assert pool.core.complete(sheddable, 1.0) == []  # a second end changes nothing
    assert pool.gate.in_flight == 1 and pool.controller.in_flight == 1


def test_a_waiting_band_of_the_same_priority_evicts_nothing() -> None:
    pool = OneSlotPool()
    pool.core.arrive(request("a", -1), 0.0)
    pool.core.arrive(request("b", -1), 0.0)
    assert pool.evicted == []


def test_without_an_evictor_nothing_is_evicted() -> None:
    gate = ConcurrencyGate(max_in_flight=1)
    controller = FlowController(FlowControlConfig(), gate, LeastLoadedPlacer(lambda: ["e:1"], gate))
    evicted: list[FlowRequest] = []
    core = Core(controller, on_evict=evicted.append)
    core.arrive(request("s", -1), 0.0)
    core.arrive(request("u", 5), 0.0)
    assert evicted == []
