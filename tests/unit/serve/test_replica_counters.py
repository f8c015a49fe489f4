"""A forwarding replica's VTC counters for its own traffic, which degraded
mode orders by (`epp.serve.replica`): bounded however many flows send."""

from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.request import InferenceRequest
from epp.serve import replica as replica_module
from epp.serve.replica import ReplicaAdmission

ENDPOINT = "10.0.0.1:8000"


def degraded_replica() -> ReplicaAdmission:
    config = FlowControlConfig()  # every band VTC
    replica = ReplicaAdmission(
        "r1", "127.0.0.1:1", 3, lambda: [ENDPOINT], lambda _: None, flow_control=lambda: config
    )
    replica.degraded = True  # no decider: it admits on its own, with no limit here
    return replica


def sent(replica: ReplicaAdmission, number: int, tenant: str) -> FlowRequest:
    payload = InferenceRequest(model="m", target_model="m", prompt="p")
    request = FlowRequest(f"r{number}", tenant, 0, float(number), input_tokens=10, payload=payload)
    assert replica.offer(request) is Outcome.DISPATCHED
    return request


def test_flows_with_nothing_at_the_replica_are_forgotten_past_a_bound(monkeypatch) -> None:
    monkeypatch.setattr(replica_module, "PRUNE_AT", 8)
    replica = degraded_replica()
    running = sent(replica, 0, "stays")
    for number in range(1, 100):
        replica.complete(sent(replica, number, f"one-off-{number}"), Usage(10, 5))
    assert len(replica._charged) <= 8 + 1
    assert (0, "stays") in replica._charged  # it runs a request here
    replica.complete(running, Usage(10, 5))
