"""Gates and the least-loaded placer: in-flight credits stay exact."""

from __future__ import annotations

from flowcontrol_support import Credits, controller, enqueue_all, request

from epp.flowcontrol.gate import AllGates, ConcurrencyGate, OpenGate
from tests.support.placers import LeastLoadedPlacer

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def pool(max_in_flight: int = 0, max_per_endpoint: int = 0, endpoints=(A, B)):
    gate = ConcurrencyGate(max_in_flight, max_per_endpoint)
    core = controller(gate=gate, placer=LeastLoadedPlacer(lambda: list(endpoints), gate))
    return core, gate


def on(endpoint: str):
    r = request()
    r.endpoint = endpoint
    return r


def test_concurrency_gate_lets_max_in_flight_through_and_no_more():
    core, gate = pool(max_in_flight=2)
    enqueue_all(core, *(request() for _ in range(5)))
    assert len(core.dispatch(0.0)) == 2
    assert (gate.in_flight, core.in_flight, core.queued_requests) == (2, 2, 3)
    assert gate.is_open(0) is False


def test_concurrency_gate_completion_lets_the_next_one_through():
    core, gate = pool(max_in_flight=1)
    first, second = request(), request()
    enqueue_all(core, first, second)
    core.dispatch(0.0)
    assert core.complete(first, 1.0) == [second]
    assert gate.in_flight == 1


def test_concurrency_gate_counts_each_endpoint_across_dispatch_and_complete():
    core, gate = pool(max_per_endpoint=2)
    rs = [request() for _ in range(4)]
    enqueue_all(core, *rs)
    core.dispatch(0.0)
    assert (gate.in_flight_at(A), gate.in_flight_at(B)) == (2, 2)
    for r in rs:
        core.complete(r, 1.0)
    assert (gate.in_flight, gate.in_flight_at(A), gate.in_flight_at(B)) == (0, 0, 0)


def test_full_endpoints_hold_the_queue_until_one_frees_up():
    core, _ = pool(max_per_endpoint=1)
    rs = [request() for _ in range(3)]
    enqueue_all(core, *rs)
    assert core.dispatch(0.0) == rs[:2]
    assert core.dispatch(0.0) == []
    on_b = next(r for r in rs[:2] if r.endpoint == B)
    assert core.complete(on_b, 1.0) == [rs[2]]
    assert rs[2].endpoint == B


def test_zero_limits_make_the_concurrency_gate_unlimited():
    gate = ConcurrencyGate(0, 0)
    for _ in range(1000):
        gate.on_dispatch(on(A))
    assert gate.is_open(0) and gate.has_room(A)


def test_endpoint_with_no_requests_has_room_and_zero_load():
    gate = ConcurrencyGate(max_per_endpoint=1)
    assert (gate.has_room(C), gate.in_flight_at(C)) == (True, 0)


def test_least_loaded_placer_picks_the_endpoint_with_fewest_in_flight():
    gate = ConcurrencyGate()
    for endpoint in (A, A, B, C, C):
        gate.on_dispatch(on(endpoint))
    assert LeastLoadedPlacer(lambda: [A, B, C], gate).place(request()) == B


def test_least_loaded_placer_breaks_ties_by_listed_order():
    gate = ConcurrencyGate()
    assert LeastLoadedPlacer(lambda: [C, A, B], gate).place(request()) == C


def test_least_loaded_placer_skips_endpoints_without_room():
    gate = ConcurrencyGate(max_per_endpoint=1)
    gate.on_dispatch(on(A))
    gate.on_dispatch(on(B))
    gate.on_dispatch(on(B))
    assert LeastLoadedPlacer(lambda: [A, B, C], gate).place(request()) == C


def test_least_loaded_placer_returns_none_when_no_endpoint_has_room():
    gate = ConcurrencyGate(max_per_endpoint=1)
    gate.on_dispatch(on(A))
    assert LeastLoadedPlacer(lambda: [A], gate).place(request()) is None


def test_least_loaded_placer_sees_endpoint_list_changes():
    gate = ConcurrencyGate()
    endpoints: list[str] = []
    placer = LeastLoadedPlacer(lambda: endpoints, gate)
    assert (placer.has_endpoints(), placer.place(request())) == (False, None)
    endpoints.append(A)
    assert (placer.has_endpoints(), placer.place(request())) == (True, A)


def test_open_gate_never_closes():
    gate = OpenGate()
    gate.on_dispatch(on(A))
    assert gate.is_open(-5)


def test_all_gates_is_open_only_when_every_gate_is():
    closed, open_ = Credits(0), Credits(1)
    assert AllGates([open_, OpenGate()]).is_open(0) is True
    assert AllGates([open_, closed]).is_open(0) is False


def test_all_gates_tells_every_gate_of_dispatch_and_completion():
    first, second = Credits(), ConcurrencyGate(max_in_flight=5)
    gates = AllGates([first, second])
    r = on(A)
    gates.on_dispatch(r)
    assert (first.dispatched, second.in_flight_at(A)) == ([r], 1)
    gates.on_complete(r)
    assert (first.completed, second.in_flight) == ([r], 0)


def test_all_gates_under_the_controller_stops_at_the_tightest_gate():
    pool_gate = ConcurrencyGate(max_in_flight=3)
    core = controller(
        gate=AllGates([pool_gate, Credits(2)]),
        placer=LeastLoadedPlacer(lambda: [A], pool_gate),
    )
    enqueue_all(core, *(request() for _ in range(5)))
    assert len(core.dispatch(0.0)) == 2
    assert pool_gate.in_flight == 2
