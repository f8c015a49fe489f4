"""The `program-aware` fairness policy (the reference's
`program-aware-fairness`, strategy `las`): least attained service first,
service decaying with its half-life on the core's clock, head-of-queue wait
as the tiebreaker, idle programs forgotten after their TTL."""

from __future__ import annotations

from flowcontrol_support import Credits, controller, dispatch_one, enqueue_all, request
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.flowcontrol.config import BandConfig, Fairness, ProgramAwareConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.fairness import ProgramAware
from epp.flowcontrol.request import Usage


def las_core(**las) -> FlowController:
    band = BandConfig(
        priority=0, fairness=Fairness.PROGRAM_AWARE, program_aware=ProgramAwareConfig(**las)
    )
    return controller(band, gate=Credits(0))


def policy(core: FlowController) -> ProgramAware:
    las = core.band(0).policy
    assert isinstance(las, ProgramAware)
    return las


def serve(core: FlowController, fairness_id: str, at: float, input_tokens: int, output_tokens: int):
    """One request of `fairness_id` queued, dispatched and completed at `at`."""
    served = request(fairness_id, arrival=at)
    enqueue_all(core, served, now=at)
    assert dispatch_one(core, at) is served
    core.complete(served, at, Usage(input_tokens, output_tokens))
    return served


def test_attained_service_is_input_plus_twice_output_added_at_completion():
    core = las_core()
    served = request("a", input_tokens=999)
    enqueue_all(core, served)
    dispatch_one(core, 0.0)
    assert policy(core).service("a", 0.0) == 0.0
    core.complete(served, 0.0, Usage(100, 50))
    assert policy(core).service("a", 0.0) == 200.0


def test_the_least_served_program_goes_first_even_behind_an_older_head():
    core = las_core()
    serve(core, "a", 0.0, input_tokens=100, output_tokens=50)
    enqueue_all(core, request("a", arrival=1.0), request("b", arrival=5.0), now=5.0)
    assert dispatch_one(core, 6.0).fairness_id == "b"


def test_attained_service_halves_every_half_life_on_the_cores_clock():
    core = las_core(half_life=60.0)
    serve(core, "a", 10.0, input_tokens=100, output_tokens=50)
    las = policy(core)
    assert las.service("a", 10.0) == 200.0
    assert las.service("a", 70.0) == 100.0
    assert las.service("a", 130.0) == 50.0
    serve(core, "a", 70.0, input_tokens=100, output_tokens=0)
    assert las.service("a", 70.0) == 200.0
    assert las.service("a", 130.0) == 100.0


def test_a_half_life_of_zero_keeps_attained_service_for_good():
    core = las_core(half_life=0.0)
    serve(core, "a", 0.0, input_tokens=100, output_tokens=50)
    assert policy(core).service("a", 1e6) == 200.0


def test_a_program_idle_long_enough_competes_again_as_its_service_decays():
    core = las_core(half_life=60.0)
    serve(core, "a", 0.0, input_tokens=1000, output_tokens=0)
    serve(core, "b", 200.0, input_tokens=100, output_tokens=0)
    # a: 1000 x 2^(-200/60) = 99.2 < b's 100, though b's head is older
    enqueue_all(core, request("b", arrival=200.0), request("a", arrival=201.0), now=201.0)
    assert dispatch_one(core, 202.0).fairness_id == "a"


def test_on_a_cold_start_the_oldest_head_goes_first():
    core = las_core()
    enqueue_all(core, *(request(name, arrival=at) for name, at in [("a", 3), ("b", 1), ("c", 2)]))
    assert [dispatch_one(core, 4.0).fairness_id for _ in range(3)] == ["b", "c", "a"]


def test_an_idle_program_is_forgotten_once_its_ttl_passes_at_a_sweep():
    core = las_core(eviction_ttl=3600.0, eviction_sweep=300.0)
    serve(core, "a", 0.0, input_tokens=10, output_tokens=0)  # its first sweep is due at 300
    serve(core, "b", 3600.0, input_tokens=10, output_tokens=0)  # sweeps: a idle exactly the TTL
    assert policy(core).service("a", 3600.0) is not None
    serve(core, "b", 3800.0, input_tokens=10, output_tokens=0)  # no sweep due before 3900
    assert policy(core).service("a", 3800.0) is not None
    serve(core, "b", 3900.0, input_tokens=10, output_tokens=0)
    assert policy(core).service("a", 3900.0) is None
    assert policy(core).programs() == 1


def test_a_program_with_a_request_in_flight_is_never_forgotten():
    core = las_core(eviction_ttl=10.0, eviction_sweep=1.0)
    serve(core, "a", 0.0, input_tokens=10, output_tokens=0)
    running = request("a", arrival=0.0)
    enqueue_all(core, running)
    dispatch_one(core, 0.0)
    serve(core, "b", 100.0, input_tokens=10, output_tokens=0)
    assert policy(core).service("a", 100.0) is not None


def test_an_eviction_ttl_of_zero_keeps_every_program():
    core = las_core(eviction_ttl=0.0, eviction_sweep=1.0)
    serve(core, "a", 0.0, input_tokens=10, output_tokens=0)
    serve(core, "b", 1e6, input_tokens=10, output_tokens=0)
    assert policy(core).programs() == 2


@settings(max_examples=60, deadline=None)
@given(
    programs=st.lists(
        st.tuples(
            st.integers(0, 5000),  # tokens served
            st.floats(0.0, 500.0),  # when that completed
            st.floats(500.0, 900.0),  # when its next request arrived
        ),
        min_size=2,
        max_size=8,
    ),
    weights=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
)
def test_the_picked_program_is_never_both_more_served_and_younger_headed_than_another(
    programs, weights
):
    core = las_core(weight_service=weights[0], weight_head_wait=weights[1])
    heads = {}
    for index, (tokens, served_at, arrival) in enumerate(programs):
        name = f"p{index}"
        if tokens:
            serve(core, name, served_at, input_tokens=tokens, output_tokens=0)
        heads[name] = arrival
    for name, arrival in sorted(heads.items(), key=lambda item: item[1]):
        enqueue_all(core, request(name, arrival=arrival), now=arrival)
    now = 1000.0
    picked = dispatch_one(core, now).fairness_id
    service = {name: policy(core).service(name, now) or 0.0 for name in heads}
    for other in heads:
        assert not (service[other] < service[picked] and heads[other] < heads[picked]), (
            picked,
            other,
        )
