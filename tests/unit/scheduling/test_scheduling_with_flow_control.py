"""The scheduler and the built gates driving the flow-control core."""

import random
from collections import Counter

from epp.flowcontrol.config import FlowControlConfig, GateConfig, GateKind
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.core import build_gate
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler

NOW = 50.0


def controller_over(pool: PoolSnapshot, max_per_endpoint: int) -> FlowController:
    gate_config = GateConfig(
        kinds=frozenset({GateKind.CONCURRENCY, GateKind.UTILIZATION}),
        max_per_endpoint=max_per_endpoint,
    )
    gate, credits = build_gate(gate_config, lambda: pool, lambda: NOW)
    scheduler = Scheduler(SchedulingConfig(), lambda: pool, lambda: NOW, random.Random(1), credits)
    return FlowController(FlowControlConfig(gate=gate_config), gate, scheduler)


def enqueue(controller: FlowController, count: int) -> list[FlowRequest]:
    requests = []
    for index in range(count):
        request = FlowRequest(
            str(index),
            "tenant",
            0,
            NOW,
            payload=InferenceRequest("m", "m", prompt=f"{index:03d}" * 40),
        )
        assert controller.enqueue(request, NOW) is None
        requests.append(request)
    return requests


def idle_pool(size: int, updated_at: float | None = NOW) -> PoolSnapshot:
    endpoints = tuple(
        Endpoint(f"e{i}", f"10.0.0.{i}:8000", metrics=EndpointMetrics(updated_at=updated_at))
        for i in range(1, size + 1)
    )
    return PoolSnapshot(endpoints=endpoints, version=1, membership=1)


def test_between_scrapes_no_endpoint_gets_more_than_its_credits():
    controller = controller_over(idle_pool(2), max_per_endpoint=3)
    enqueue(controller, 20)
    dispatched = controller.dispatch(NOW)
    assert Counter(request.endpoint for request in dispatched) == {
        "10.0.0.1:8000": 3,
        "10.0.0.2:8000": 3,
    }


def test_a_completion_frees_one_credit_on_its_endpoint():
    controller = controller_over(idle_pool(2), max_per_endpoint=3)
    enqueue(controller, 20)
    first = controller.dispatch(NOW)[0]
    assert [request.endpoint for request in controller.complete(first, NOW)] == [first.endpoint]


def test_a_pool_with_stale_metrics_dispatches_nothing():
    controller = controller_over(idle_pool(2, updated_at=NOW - 10.0), max_per_endpoint=3)
    enqueue(controller, 5)
    assert controller.dispatch(NOW) == []
