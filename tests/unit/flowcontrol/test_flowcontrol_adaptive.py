"""The adaptive gate: limits learned from the servers' own metrics, a pending
budget per endpoint, and headroom that only the top band may use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.flowcontrol.adaptive import (
    KV_FULL,
    LATENCY_SAMPLES,
    RECENT_SECONDS,
    RECENT_WINDOW,
    REFERENCE_SPAN,
    STEP_ARRIVALS,
    AdaptiveGate,
    AdaptiveLimits,
    LimitEstimator,
    allowed,
    fits,
    median_grown,
    median_without,
)
from epp.flowcontrol.request import FlowRequest, State
from epp.flowcontrol.usagelimits import StaticUsageLimit, UsageLimitPolicy
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
C, D = "10.0.0.3:8000", "10.0.0.4:8000"
SETTINGS = AdaptiveLimits()


def sample(
    at: float,
    running: int = 0,
    waiting: int = 0,
    itl_sum: float = 0.0,
    itl_count: float = 0.0,
    **extra,
) -> EndpointMetrics:
    return EndpointMetrics(
        waiting=waiting,
        running=running,
        updated_at=at,
        itl_sum=itl_sum,
        itl_count=itl_count,
        **extra,
    )


def found_at(limit: int) -> LimitEstimator:
    """An estimator whose probe found the server full at `limit`."""
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(0.0, running=limit), binding=True)
    estimator.observe(sample(0.05, running=limit, waiting=1), binding=True)
    estimator.observe(sample(1.1, running=limit, waiting=1), binding=True)
    assert (estimator.limit, estimator.probing, estimator.found) == (limit, False, True)
    return estimator


# -- the estimator ------------------------------------------------------------


def test_a_new_endpoint_starts_at_the_initial_limit_and_probes():
    estimator = LimitEstimator(SETTINGS)
    assert (estimator.limit, estimator.probing, estimator.found) == (SETTINGS.initial, True, False)


def test_the_limit_grows_to_what_the_server_is_seen_running():
    estimator = LimitEstimator(SETTINGS)
    assert estimator.observe(sample(0.0, running=9), binding=True) == 9 - SETTINGS.initial
    assert estimator.limit == 9


def test_a_probe_that_finds_no_room_for_full_after_holds_the_limit():
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(0.0, running=6, waiting=1), binding=True)
    estimator.observe(sample(SETTINGS.full_after - 0.01, running=6, waiting=1), binding=True)
    assert estimator.probing
    estimator.observe(sample(SETTINGS.full_after, running=6, waiting=1), binding=True)
    assert (estimator.limit, estimator.probing, estimator.found) == (6, False, True)


def test_a_probe_nothing_wanted_is_no_news():
    estimator = LimitEstimator(SETTINGS)
    for step in range(40):
        estimator.observe(sample(step * 0.1, running=3), binding=False)
    assert estimator.probing and not estimator.found


def test_once_found_a_probe_starts_after_probe_interval_while_the_limit_holds_demand_back():
    estimator = found_at(16)
    estimator.observe(sample(1.1 + SETTINGS.probe_interval - 0.1, running=16), binding=True)
    assert not estimator.probing
    estimator.observe(sample(1.1 + SETTINGS.probe_interval, running=16), binding=False)
    assert not estimator.probing
    estimator.observe(sample(1.2 + SETTINGS.probe_interval, running=16), binding=True)
    assert estimator.probing


def test_a_denied_probe_waits_another_interval():
    estimator = found_at(16)
    estimator.observe(sample(1.1 + SETTINGS.probe_interval - 0.1, running=16), binding=True)
    later = 1.2 + SETTINGS.probe_interval
    estimator.observe(sample(later, running=16), binding=True, may_probe=False)
    assert not estimator.probing
    estimator.observe(sample(later + 0.1, running=16), binding=True)
    assert not estimator.probing
    estimator.observe(sample(later + SETTINGS.probe_interval - 0.1, running=16), binding=True)
    assert not estimator.probing
    estimator.observe(sample(later + SETTINGS.probe_interval + 0.1, running=16), binding=True)
    assert estimator.probing


def test_the_limit_drops_when_the_server_keeps_a_queue_well_below_it():
    estimator = found_at(32)
    for step in range(1, 40):
        estimator.observe(sample(1.1 + step * 0.05, running=12, waiting=1), binding=True)
    assert estimator.limit == 32  # the window that saw it run 32 has not passed
    for step in range(40, 100):
        estimator.observe(sample(1.1 + step * 0.05, running=12, waiting=1), binding=True)
    assert estimator.limit == 12


def test_a_queue_near_the_limit_half_the_time_does_not_lower_it():
    estimator = found_at(32)
    for step in range(1, 100):
        waiting = step % 2  # a request caught between two steps, every other sample
        estimator.observe(sample(1.1 + step * 0.05, running=30, waiting=waiting), binding=True)
    assert estimator.limit == 32


def test_a_queue_throughout_a_window_lowers_the_limit_to_what_the_server_runs():
    # A server that shrank and is draining what it held: the slot between
    # what it runs and the limit is not there, and a top-band request would
    # wait in it.
    estimator = found_at(32)
    for step in range(1, 100):
        estimator.observe(sample(1.1 + step * 0.05, running=30, waiting=1), binding=True)
    assert estimator.limit == 30


# A server that reports its latency histogram shows its step ends: the
# count moves at each decode step (its bounds are there from the start).
STEPS = {"itl_bounds": (0.01, 0.1, 1.0)}


def test_a_probe_that_waits_out_one_long_step_is_not_refused():
    # A long prefill step: the request waits for its end, not for room.
    estimator = LimitEstimator(SETTINGS)
    for step in range(60):
        estimator.observe(
            sample(step * 0.05, running=6, waiting=1, itl_count=100.0, **STEPS), binding=True
        )
    assert (estimator.limit, estimator.probing, estimator.found) == (6, True, False)


def test_a_probe_at_a_stepping_server_ends_at_its_first_refusal():
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(0.0, running=6, waiting=1, itl_count=100.0, **STEPS), binding=True)
    assert estimator.probing
    # A step ended, and the request sent before the first read still waits.
    estimator.observe(sample(0.05, running=6, waiting=1, itl_count=106.0, **STEPS), binding=True)
    assert (estimator.limit, estimator.probing, estimator.found) == (6, False, True)


@pytest.mark.parametrize(("kv_usage", "room"), [(KV_FULL, True), (KV_FULL - 0.1, False)])
def test_a_server_that_refused_with_its_kv_cache_full_may_keep_one_waiting(kv_usage, room):
    # Its blocks free at every completion: one request waiting there takes
    # them at the next step. Refused with blocks to spare, it is full of
    # sequences, and one more would only wait.
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(0.0, running=8, itl_count=100.0, **STEPS), binding=True)
    estimator.observe(
        sample(0.05, running=8, waiting=1, kv_usage=kv_usage, itl_count=108.0, **STEPS),
        binding=True,
    )
    assert (estimator.limit, estimator.probing, estimator.found) == (8, False, True)
    estimator.pending = 0
    assert fits(estimator, allowed(8, 0.9), 0.9, 0.1) is room


def test_the_shrink_window_counts_only_samples_across_a_step_end():
    estimator = found_at(32)
    at = 1.1
    for _ in range(100):  # a queue through one long step: what arrived waits for its end
        at += 0.05
        estimator.observe(sample(at, running=12, waiting=1, itl_count=50.0, **STEPS), True)
    assert estimator.limit == 32
    count = 50.0
    for _ in range(100):  # a queue through its step ends: it runs 12
        at += 0.05
        count += 12.0
        estimator.observe(sample(at, running=12, waiting=1, itl_count=count, **STEPS), True)
    assert estimator.limit == 12


def test_a_sample_is_used_once_and_failed_or_unread_ones_not_at_all():
    estimator = LimitEstimator(SETTINGS)
    assert estimator.observe(sample(1.0, running=7), binding=True) == 3
    assert estimator.observe(sample(1.0, running=9), binding=True) is None
    assert estimator.observe(sample(2.0, running=9, failing=True), binding=True) is None
    assert estimator.observe(EndpointMetrics(running=9), binding=True) is None
    assert estimator.limit == 7


@given(
    st.lists(
        st.tuples(st.integers(0, 300), st.integers(0, 20), st.booleans()), min_size=1, max_size=80
    )
)
def test_the_limit_stays_between_one_and_the_maximum(samples):
    settings = AdaptiveLimits(maximum=200)
    estimator = LimitEstimator(settings)
    for step, (running, waiting, binding) in enumerate(samples):
        estimator.observe(sample(step * 0.3, running=running, waiting=waiting), binding)
        assert 1 <= estimator.limit <= settings.maximum


# -- the share of a limit a band may fill --------------------------------------


def test_a_ceiling_below_one_holds_back_at_least_one_slot_and_leaves_at_least_one():
    assert [allowed(16, c) for c in (1.0, 0.95, 0.9, 0.5)] == [16, 15, 14, 8]
    assert [allowed(2, 0.99), allowed(1, 0.5), allowed(8, 0.0)] == [1, 1, 0]


# -- the gate ----------------------------------------------------------------


class Pool:
    """A pool snapshot the test replaces sample by sample."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.snapshot = PoolSnapshot()
        self.now = 0.0
        self.publish(0.0)

    def publish(
        self, at: float, read: float | None = None, **per_address: tuple[float, ...]
    ) -> None:
        """Samples arriving at `at`, of the servers as read at `read` (`at`)."""
        self.now = at
        stamp = at if read is None else read
        endpoints = tuple(
            Endpoint(address, address, metrics=sample(stamp, *per_address.get(key, (0, 0))))
            for key, address in zip("abcd", self.addresses, strict=False)
        )
        self.snapshot = PoolSnapshot(endpoints, self.snapshot.version + 1, 1)


SEQ = iter(range(1, 1 << 30))


def dispatch(gate: AdaptiveGate, endpoint: str, priority: int = 0) -> FlowRequest:
    request = FlowRequest(f"r{gate.in_flight}", "tenant", priority, 0.0)
    request.endpoint = endpoint
    request.seq = next(SEQ)
    request.state = State.DISPATCHED  # as the core does before it tells the gate
    gate.on_dispatch(request)
    return request


def gate_with_bands(
    pool: Pool, *priorities: int, usage: UsageLimitPolicy | None = None
) -> AdaptiveGate:
    gate = AdaptiveGate(lambda: pool.snapshot, lambda: pool.now, usage=usage)
    for priority in priorities:
        gate.is_open(priority)
    gate.has_room(A, priorities[-1])  # reads the first snapshot, as a placement does
    return gate


def send_while_room(gate: AdaptiveGate) -> int:
    """Dispatch band-0 requests to A while its pending budget has room, with
    no new sample, a step of the server ending after every `STEP_ARRIVALS`
    (as a completion or a first token there would tell)."""
    sent = 0
    while True:
        if not gate.has_room(A, 0):
            estimator = gate._estimators[A]
            if estimator.burst < STEP_ARRIVALS:
                return sent
            estimator.burst = 0
            continue
        dispatch(gate, A)
        sent += 1


def test_an_endpoint_takes_one_request_it_was_not_yet_seen_running():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    assert gate.has_room(A, 0)
    dispatch(gate, A)
    assert not gate.has_room(A, 0)
    pool.publish(0.05, a=(1, 0))
    assert gate.has_room(A, 0)


def test_a_searching_endpoint_with_no_queue_may_be_sent_twice_what_it_took():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(0, 0))
    assert gate.has_room(A, 0)
    dispatch(gate, A)
    assert not gate.has_room(A, 0)
    pool.publish(0.1, a=(1, 0))  # it took the one it was sent, and queues nothing
    assert send_while_room(gate) == 2


@pytest.mark.parametrize(("step", "paced"), [(0.01, 4), (0.03, 2)])
def test_a_searching_endpoint_with_steps_of_half_the_sampling_interval_has_two_pending_at_most(
    step, paced
):
    # What it is sent during a step waits for the step's end: twice what
    # it took would be its queue at the next sample.
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    histogram = Histogram()
    pool.publish(0.05, a=(10, 0, *histogram.run(0.05, step, batch=10)))
    gate.has_room(A, 0)  # reads it
    for _ in range(2):
        dispatch(gate, A)
    pool.publish(0.1, a=(12, 0, *histogram.run(0.05, step, batch=12)))  # it took both
    assert send_while_room(gate) == paced


def test_an_endpoint_that_kept_a_request_waiting_a_whole_interval_is_paced_one_at_a_time():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(1, 1))  # waiting, though sent nothing since the last sample
    gate.has_room(A, 0)
    pool.publish(0.1, a=(2, 0))
    for at in (0.15, 0.2):  # each sample: it took the one it was sent, no queue
        assert gate.has_room(A, 0)
        dispatch(gate, A)
        assert not gate.has_room(A, 0)
        pool.publish(at, a=(gate.in_flight_at(A) + 2, 0))
    assert gate.has_room(A, 0)
    dispatch(gate, A)
    assert not gate.has_room(A, 0)


def test_a_searching_endpoint_well_below_its_limit_with_no_queue_is_no_longer_taken_for_full():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(10, 0))
    gate.has_room(A, 0)
    pool.publish(0.1, a=(10, 2))  # waiting, though sent nothing: a long step, or full
    gate.has_room(A, 0)
    assert gate._estimators[A].crowded
    pool.publish(0.15, a=(6, 0))
    gate.has_room(A, 0)
    assert gate._estimators[A].crowded  # a queue at the sample before
    pool.publish(0.2, a=(4, 0))  # under half the 10 it ran, no queue twice
    gate.has_room(A, 0)
    assert not gate._estimators[A].crowded


def test_a_searching_endpoint_with_a_young_queue_may_be_sent_what_it_took_beside_it():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(0, 0))
    for _ in range(3):
        gate.has_room(A, 0)  # the fast path: nothing pending since a first token
        request = dispatch(gate, A)
        gate.on_first_token(request)
    pool.publish(0.1, a=(2, 1))  # one of the three it was sent still waits
    assert send_while_room(gate) == 2  # what it took; the one waiting goes in at its next step


def test_a_queue_of_what_arrived_since_the_last_read_is_no_refusal():
    # Each request arrives mid-step and waits for the step's end: however
    # long that goes on, the server was not seen refusing one.
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    count = 0.0
    request = None
    for step in range(1, 60):
        if request is not None:
            gate.on_complete(request)
        request = dispatch(gate, A)
        count += 4.0
        pool.publish(step * 0.05, a=(4, 1, 0.0, count))  # at its limit: no shrink
        gate.has_room(A, 0)
    estimator = gate._estimators[A]
    assert (estimator.probing, estimator.found) == (True, False)


def test_a_searching_endpoint_is_sent_what_it_took_once_its_queue_went_in():
    # Rule 4's floor: the budget is never below what the server admitted
    # over the last interval, queue or no queue at the sample before.
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(10, 0))
    for _ in range(3):
        gate.has_room(A, 0)
        request = dispatch(gate, A)
        gate.on_first_token(request)
    pool.publish(0.1, a=(12, 1))  # one of the three waits for the next step
    assert send_while_room(gate) == 2
    pool.publish(0.15, a=(15, 0))  # it took the one waiting and the two sent
    assert send_while_room(gate) == 3


def test_a_request_sent_while_its_sample_was_on_the_way_is_not_a_stale_queue():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(0, 0))
    gate.has_room(A, 0)
    dispatch(gate, A)  # sent after the server was read for the next sample
    pool.publish(0.1, a=(0, 0))  # which does not show it yet
    gate.has_room(A, 0)
    pool.publish(0.15, a=(0, 1))  # waiting since 0.1 at most: between two steps
    gate.has_room(A, 0)
    assert not gate._estimators[A].crowded


def test_the_top_band_may_send_one_more_than_the_pending_budget():
    pool = Pool(A)
    gate = gate_with_bands(pool, 10, 0)
    dispatch(gate, A, 0)
    assert not gate.has_room(A, 0)
    assert gate.has_room(A, 10)


def settled_gate(
    limit: int, *priorities: int, usage: UsageLimitPolicy | None = None
) -> tuple[Pool, AdaptiveGate]:
    """A gate whose endpoint A was found full at `limit` and now runs nothing."""
    pool = Pool(A)
    gate = gate_with_bands(pool, *priorities, usage=usage)
    for at, state in ((0.05, (limit, 0)), (0.1, (limit, 1)), (1.2, (limit, 1)), (1.25, (0, 0))):
        gate.blocked.add(A)
        pool.publish(at, a=state)
        gate.has_room(A, priorities[-1])
    assert gate.limit_of(A) == limit and not gate._estimators[A].probing
    return pool, gate


def fill(gate: AdaptiveGate, pool: Pool, priority: int) -> int:
    """Dispatch `priority` requests to A while it has room, each seen running."""
    sent = 0
    while gate.has_room(A, priority):
        dispatch(gate, A, priority)
        sent += 1
        pool.publish(2.0 + gate.in_flight * 0.05, a=(gate.in_flight_at(A), 0))
    return sent


def test_a_server_of_known_size_below_its_top_may_be_sent_twice_what_it_took():
    pool, gate = settled_gate(32, 0)
    for _ in range(3):
        dispatch(gate, A)
    pool.publish(1.3, a=(20, 0))  # took all three; too busy for the fast fill
    assert send_while_room(gate) == 6


def test_a_server_of_known_size_below_its_top_with_a_young_queue_may_be_sent_what_it_took():
    pool, gate = settled_gate(32, 0)
    for _ in range(4):
        dispatch(gate, A)
    pool.publish(1.3, a=(20, 1))  # took three, the fourth waits for the next step
    assert send_while_room(gate) == 3


def test_a_server_of_known_size_with_a_stale_queue_is_sent_one_at_a_time():
    pool, gate = settled_gate(32, 0)
    pool.publish(1.3, a=(20, 0))
    assert gate.has_room(A, 0)
    pool.publish(1.35, a=(20, 1))  # waiting, though sent nothing in two intervals
    assert not gate.has_room(A, 0)  # the one waiting is all it may have pending


def test_a_server_of_known_size_with_steps_of_half_the_sampling_interval_has_two_pending_at_most():
    pool, gate = settled_gate(32, 0)
    histogram = Histogram()
    pool.publish(1.3, a=(17, 0, *histogram.run(0.05, 0.03, batch=17)))
    gate.has_room(A, 0)  # reads it
    for _ in range(3):
        dispatch(gate, A)
    pool.publish(1.35, a=(20, 0, *histogram.run(0.05, 0.03, batch=20)))  # took all three
    assert send_while_room(gate) == 2  # twice what it took with shorter steps


def test_a_server_of_known_size_near_its_top_is_sent_one_at_a_time():
    pool, gate = settled_gate(32, 0)
    for _ in range(3):
        dispatch(gate, A)
    pool.publish(1.3, a=(28, 0))
    assert gate.has_room(A, 0)
    dispatch(gate, A)
    assert not gate.has_room(A, 0)


def test_lower_bands_leave_the_last_slots_to_higher_ones():
    pool, gate = settled_gate(16, 10, 0, -5)
    assert fill(gate, pool, -5) == 14
    assert fill(gate, pool, 0) == 1
    assert fill(gate, pool, 10) == 1
    assert gate.headroom_of(A) == 2


def test_one_band_alone_fills_the_whole_limit():
    pool, gate = settled_gate(16, 0)
    assert fill(gate, pool, 0) == 16


def test_a_completion_gives_its_slot_back():
    pool, gate = settled_gate(4, 0)
    fill(gate, pool, 0)
    request = FlowRequest("done", "tenant", 0, 0.0)
    request.endpoint = A
    gate.on_complete(request)
    assert gate.in_flight_at(A) == 3 and gate.has_room(A, 0)


def test_a_top_band_request_prefers_an_endpoint_with_nothing_pending():
    pool = Pool(A, B)
    gate = gate_with_bands(pool, 10, 0)
    dispatch(gate, A, 0)
    assert not gate.has_room(A, 10)
    assert gate.has_room(B, 10)


def searching_at(size: int) -> tuple[Pool, AdaptiveGate]:
    """A gate whose endpoint A was found full at 8 and whose B, still
    searching, runs all `size` it holds with no queue."""
    pool = Pool(A, B)
    gate = gate_with_bands(pool, 10, 0)
    for at, state in ((0.05, (8, 0)), (0.1, (8, 1)), (1.2, (8, 1)), (1.25, (0, 0))):
        gate.blocked.add(A)
        pool.publish(at, a=state)
        gate.has_room(A, 0)
    for _ in range(size):
        dispatch(gate, B)
    pool.publish(1.3, a=(0, 0), b=(size, 0))
    gate.has_room(B, 0)
    assert gate._estimators[A].found and gate.limit_of(B) == size
    assert gate._estimators[B].probing and not gate._estimators[B].found
    return pool, gate


def test_a_top_band_request_takes_no_probe_slot_at_a_size_found_full_elsewhere():
    _, gate = searching_at(8)
    # One like it is full at 8: the top-band request would wait there for a
    # completion, where the EPP gives it the first slot the pool frees.
    assert not gate.has_room(B, 10)
    assert gate.has_room(B, 0)  # the bands below still search


def test_a_top_band_request_takes_the_probe_slot_below_or_past_sizes_found_full():
    for size in (7, 9):
        _, gate = searching_at(size)
        assert gate.has_room(B, 10)


def test_endpoints_of_known_size_probe_in_turn_a_quarter_of_the_pool_at_a_time():
    # Four endpoints found full together: were all four to probe at once,
    # the bands below the top would fill every endpoint's headroom.
    pool = Pool(A, B, C, D)
    gate = gate_with_bands(pool, 0)
    full, queued = (16, 0), (16, 1)
    for at, state in ((0.05, full), (0.1, queued), (1.2, queued)):
        gate.blocked.update((A, B, C, D))
        pool.publish(at, a=state, b=state, c=state, d=state)
        gate.has_room(A, 0)
    estimators = gate._estimators
    assert all(e.found and not e.probing for e in estimators.values())
    probed, most_at_once = set(), 0
    for step in range(1, 300):
        # Demand held back everywhere; a probing server is found full.
        gate.blocked.update((A, B, C, D))
        states = [queued if estimators[x].probing else full for x in (A, B, C, D)]
        pool.publish(1.2 + step * 0.1, **dict(zip("abcd", states, strict=True)))
        gate.has_room(A, 0)
        probing = {x for x, e in estimators.items() if e.probing}
        probed |= probing
        most_at_once = max(most_at_once, len(probing))
    assert most_at_once == 1
    assert probed == {A, B, C, D}


def test_an_endpoint_that_leaves_the_pool_is_forgotten():
    pool = Pool(A, B)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(9, 0), b=(9, 0))
    gate.has_room(A, 0)
    assert gate.limits() == {A: 9, B: 9}
    pool.addresses = (A,)
    pool.publish(0.1, a=(9, 0))
    gate.has_room(A, 0)
    assert gate.limits() == {A: 9}


def test_the_configured_usage_limit_policy_sets_the_headroom():
    pool, gate = settled_gate(16, 10, 0, -5, usage=StaticUsageLimit(1.0))
    assert fill(gate, pool, -5) == 16
    assert gate.headroom_of(A) == 0


def test_an_endpoint_without_recent_metrics_gets_the_fixed_limit_and_no_budget():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    dispatch(gate, A)
    assert not gate.has_room(A, 0)  # learning: one pending request at a time
    pool.now = 0.0 + SETTINGS.blind_after + 0.01  # no sample since
    for _ in range(31):
        assert gate.has_room(A, 0)
        dispatch(gate, A)
    assert not gate.has_room(A, 0)  # blind: maxPerEndpoint (32) in flight


def test_an_endpoint_new_to_the_pool_is_learned_from_the_start_not_flooded_before_its_sample():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.now = 5.0
    pool.snapshot = PoolSnapshot(
        (*pool.snapshot.endpoints, Endpoint(B, B)), pool.snapshot.version + 1, 1
    )  # B joins (a restarted server): no sample of it yet
    dispatch(gate, B)
    assert not gate.has_room(B, 0)  # learning: one pending request at a time
    pool.now = 5.0 + SETTINGS.blind_after + 0.01  # still no sample: blind
    assert gate.has_room(B, 0)


def test_a_request_done_before_any_sample_showed_it_running_is_no_longer_pending():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    earlier = dispatch(gate, A)
    pool.publish(0.05, a=(1, 0))
    gate.has_room(A, 0)
    later = dispatch(gate, A)
    gate.on_complete(earlier)
    assert gate._estimators[A].pending == 1  # `earlier` was seen running
    gate.on_complete(later)
    assert gate._estimators[A].pending == 0


def test_a_request_sent_after_the_server_was_read_stays_pending_past_its_sample():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    gate.on_first_token(dispatch(gate, A))
    pool.now = 0.045
    dispatch(gate, A)  # after the scrape's read, before its sample arrives
    pool.publish(0.05, read=0.04, a=(1, 0))  # one running, none waiting: not the second
    gate.has_room(A, 0)  # reads the sample
    assert gate._estimators[A].pending == 1


def pending_after_a_read(sent_at: float) -> int:
    """A request sent at `sent_at`, another (seen running at 0.1) ending at
    0.145, both after the sample before and the other after the read at
    0.14 that shows it running: what the endpoint has pending after it."""
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    pool.publish(0.05, a=(0, 0))
    gate.has_room(A, 0)
    first = dispatch(gate, A)
    pool.publish(0.1, a=(1, 0))
    gate.has_room(A, 0)
    pool.now = sent_at
    dispatch(gate, A)
    pool.now = 0.145
    gate.on_complete(first)
    pool.publish(0.15, read=0.14, a=(1, 0))
    gate.has_room(A, 0)
    return gate._estimators[A].pending


def test_a_request_sent_after_the_read_is_pending_though_another_ended_meanwhile():
    assert pending_after_a_read(0.145) == 1


def test_a_request_on_its_way_at_the_read_stays_pending_though_another_ended_after_it():
    assert pending_after_a_read(0.13) == 1  # sent before the read, not there yet


def test_before_a_step_is_measured_only_a_step_end_heard_lets_more_than_step_arrivals_go():
    pool, gate = settled_gate(64, 0)  # no histogram: no step length known
    for _ in range(4):
        dispatch(gate, A)
    pool.publish(1.3, a=(4, 0))  # it took four: it may be sent eight
    gate.has_room(A, 0)
    assert gate._estimators[A].budget > STEP_ARRIVALS
    sent = [dispatch(gate, A) for _ in range(STEP_ARRIVALS)]
    pool.now += 0.04
    assert not gate.has_room(A, 0)
    gate.on_first_token(sent[0])
    assert gate.has_room(A, 0)


def stepping_gate(step: float = 0.02) -> tuple[Pool, AdaptiveGate]:
    """A settled gate (limit 64) whose server's steps last `step` and which
    took the four it was sent by its last sample (so its budget is eight)."""
    pool, gate = settled_gate(64, 0)
    histogram = Histogram()
    pool.publish(1.3, a=(0, 0, *histogram.run(0.05, step)))
    gate.has_room(A, 0)
    for _ in range(4):
        dispatch(gate, A)
    pool.publish(1.35, a=(4, 0, *histogram.run(0.05, step)))
    gate.has_room(A, 0)
    return pool, gate


def test_at_most_step_arrivals_go_to_an_endpoint_within_one_of_its_steps():
    _, gate = stepping_gate()
    assert gate._estimators[A].budget > STEP_ARRIVALS
    for _ in range(STEP_ARRIVALS):
        dispatch(gate, A)
    assert not gate.has_room(A, 0)  # what it is sent within one step waits for its end


def test_once_a_mean_step_passed_with_little_pending_the_next_step_takes_more():
    pool, gate = stepping_gate(step=0.02)
    dispatch(gate, A)
    pool.now += 0.02  # a mean step: the one sent was in the step that ended
    for _ in range(STEP_ARRIVALS):
        assert gate.has_room(A, 0)
        dispatch(gate, A)
    assert not gate.has_room(A, 0)


def test_a_mean_step_ends_no_step_while_a_steps_arrivals_are_still_pending():
    pool, gate = stepping_gate(step=0.02)
    for _ in range(STEP_ARRIVALS):
        dispatch(gate, A)
    pool.now += 0.05  # a prefill step outlasts the mean: they may wait in it
    assert not gate.has_room(A, 0)


def test_a_first_token_ends_the_step_and_lets_the_next_ones_go():
    _, gate = stepping_gate()
    sent = [dispatch(gate, A) for _ in range(STEP_ARRIVALS)]
    assert not gate.has_room(A, 0)
    assert gate.on_first_token(sent[0])  # made room: the shell pokes the core
    assert gate.has_room(A, 0)


def test_a_completion_that_leaves_little_pending_ends_the_step_and_lets_the_next_ones_go():
    _, gate = stepping_gate()
    sent = [dispatch(gate, A) for _ in range(STEP_ARRIVALS)]
    assert not gate.has_room(A, 0)
    gate.on_complete(sent[0])  # done before any sample: no longer pending
    assert gate.has_room(A, 0)


def test_a_completion_heard_while_a_steps_arrivals_are_pending_ends_no_step_for_them():
    pool, gate = stepping_gate()
    older = [dispatch(gate, A) for _ in range(4)]
    pool.publish(pool.now + 0.05, a=(8, 0))
    gate.has_room(A, 0)
    for _ in range(STEP_ARRIVALS):
        dispatch(gate, A)
    # Its step ended a path before the EPP heard of it: the two sent just
    # before may have arrived after it, and wait for the next.
    gate.on_complete(older[0])
    assert not gate.has_room(A, 0)


def test_a_sample_ends_no_step_for_what_it_could_not_show():
    pool, gate = stepping_gate()
    pool.now += 0.045
    for _ in range(STEP_ARRIVALS):
        dispatch(gate, A)  # after the next sample's read
    pool.publish(pool.now + 0.005, read=pool.now - 0.005, a=(0, 0))
    assert not gate.has_room(A, 0)


def test_a_request_on_its_way_at_the_read_shares_the_step_after_it_with_the_next():
    pool, gate = settled_gate(64, 0)
    histogram = Histogram()
    pool.publish(1.3, a=(0, 0, *histogram.run(0.05, 0.02)))
    gate.has_room(A, 0)
    for _ in range(4):
        dispatch(gate, A)
    pool.publish(1.35, a=(4, 0, *histogram.run(0.05, 0.02)))
    gate.has_room(A, 0)
    pool.now = 1.36
    for _ in range(3):
        dispatch(gate, A)  # seen running at the next read
    pool.now = 1.37
    dispatch(gate, A)  # not there yet at the read, more than a step later
    pool.publish(1.41, read=1.4, a=(7, 0, *histogram.run(0.05, 0.02)))
    assert gate.has_room(A, 0)
    assert gate._estimators[A].pending == 1
    dispatch(gate, A)
    # The one on its way arrives within the step after the read, as this one
    # does: the step that ended before the read was not theirs.
    assert not gate.has_room(A, 0)


def test_an_endpoint_whose_requests_finish_between_samples_gets_the_fixed_limit():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    for _ in range(2):  # each sent after the sample and done before the next
        gate.on_complete(dispatch(gate, A))
    pool.publish(0.05)
    for _ in range(32):
        assert gate.has_room(A, 0)
        dispatch(gate, A)
    assert not gate.has_room(A, 0)  # maxPerEndpoint (32) in flight


def test_an_endpoint_learns_again_once_its_requests_outlast_the_sampling_interval():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    for _ in range(2):
        gate.on_complete(dispatch(gate, A))
    pool.publish(0.05)
    gate.has_room(A, 0)
    long = [dispatch(gate, A) for _ in range(2)]
    pool.publish(0.1, a=(2, 0))
    gate.has_room(A, 0)
    for request in long:  # seen by the sample at 0.1 s, done after it
        gate.on_complete(request)
    pool.publish(0.15)
    gate.has_room(A, 0)
    dispatch(gate, A)
    assert not gate.has_room(A, 0)  # learning: one pending request at a time


def test_one_request_done_unseen_in_an_interval_says_nothing():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    gate.on_complete(dispatch(gate, A))
    pool.publish(0.05)
    gate.has_room(A, 0)
    dispatch(gate, A)
    dispatch(gate, A)  # twice what it took since its last sample: still learned from
    assert not gate.has_room(A, 0)


def test_a_first_token_lets_the_endpoint_take_the_next_request_before_its_next_sample():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    request = dispatch(gate, A)
    assert not gate.has_room(A, 0)
    assert gate.on_first_token(request)
    assert gate.has_room(A, 0)


def test_a_request_counts_off_the_pending_budget_once_first_token_then_completion():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    started, waiting = dispatch(gate, A), dispatch(gate, A)
    gate.on_first_token(started)
    assert not gate.on_first_token(started)  # the same token again: no news
    gate.on_complete(started)
    assert gate._estimators[A].pending == 1  # `waiting` still is
    gate.on_complete(waiting)
    assert gate._estimators[A].pending == 0


def test_a_first_token_of_a_request_the_last_sample_covered_changes_nothing():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    request = dispatch(gate, A)
    pool.publish(0.05, a=(0, 1))  # the server still holds it in its queue
    gate.has_room(A, 0)
    assert not gate.on_first_token(request)  # the next sample will show it
    assert gate._estimators[A].pending == 1


def test_a_first_token_after_the_request_ended_changes_nothing():
    pool = Pool(A)
    gate = gate_with_bands(pool, 0)
    ended, _other = dispatch(gate, A), dispatch(gate, A)
    gate.on_complete(ended)
    ended.state = State.COMPLETED
    assert not gate.on_first_token(ended)
    assert gate._estimators[A].pending == 1  # `other`'s count stays


# -- knowing there is no room without looking again ------------------------------


def full_pool() -> tuple[Pool, AdaptiveGate, tuple[Endpoint, ...], list[FlowRequest]]:
    """Two learning endpoints, each with its one pending request, and
    `with_room` asked once (it found none)."""
    pool = Pool(A, B)
    gate = gate_with_bands(pool, 0)
    sent = [dispatch(gate, A), dispatch(gate, B)]
    endpoints = pool.snapshot.endpoints
    assert gate.may_have_room(endpoints, 0)  # not asked yet
    assert gate.with_room(endpoints, 0) == []
    return pool, gate, endpoints, sent


def test_no_room_found_is_known_until_something_changes():
    _, gate, endpoints, _ = full_pool()
    assert not gate.may_have_room(endpoints, 0)
    assert gate.may_have_room(list(endpoints), 0)  # other candidates: not known
    assert gate.may_have_room(endpoints, 10)  # another band: not known


def test_a_first_token_that_frees_the_pending_budget_may_make_room():
    _, gate, endpoints, sent = full_pool()
    assert gate.on_first_token(sent[0])
    assert gate.may_have_room(endpoints, 0)
    assert gate.with_room(endpoints, 0) == [endpoints[0]]


def test_a_completion_held_back_by_the_pending_budget_makes_no_room():
    pool, gate, _, sent = full_pool()
    pool.publish(0.05, a=(1, 0), b=(1, 0))
    endpoints = pool.snapshot.endpoints
    later = []  # pending again, sent after the sample
    while room := gate.with_room(endpoints, 0):
        later.append(dispatch(gate, room[0].address))
    gate.on_complete(sent[0])  # seen running: the pending count stays
    assert not gate.may_have_room(endpoints, 0)
    gate.on_complete(later[-1])  # never seen: no longer pending where it went
    assert gate.may_have_room(endpoints, 0)


def test_a_new_snapshot_may_make_room():
    pool, gate, endpoints, _ = full_pool()
    pool.publish(0.05, a=(1, 0), b=(1, 0))
    assert gate.may_have_room(endpoints, 0)


def test_a_sample_turning_stale_may_make_room():
    pool, gate, endpoints, _ = full_pool()
    pool.now = SETTINGS.blind_after
    assert not gate.may_have_room(endpoints, 0)
    pool.now = SETTINGS.blind_after + 0.01  # the fixed limit applies from now
    assert gate.may_have_room(endpoints, 0)
    assert gate.with_room(endpoints, 0) == list(endpoints)


def test_room_one_endpoint_made_and_a_dispatch_took_is_known_gone_again():
    _, gate, endpoints, sent = full_pool()
    gate.on_first_token(sent[0])
    dispatch(gate, A)
    assert not gate.may_have_room(endpoints, 0)


def test_room_two_endpoints_made_is_not_known_gone_after_one_dispatch():
    _, gate, endpoints, sent = full_pool()
    gate.on_first_token(sent[0])
    gate.on_first_token(sent[1])
    dispatch(gate, A)
    assert gate.may_have_room(endpoints, 0)
    assert gate.with_room(endpoints, 0) == [endpoints[1]]


@settings(max_examples=400)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("dispatch"), st.integers(0, 1)),
            st.tuples(st.sampled_from(["complete", "first token"]), st.integers(0, 40)),
            st.tuples(st.just("publish"), st.integers(0, 6), st.integers(0, 2)),
            st.tuples(st.just("wait"), st.floats(0.0, 1.5)),
        ),
        max_size=60,
    )
)
def test_no_room_is_known_only_where_with_room_finds_none(steps):
    pool = Pool(A, B)
    gate = gate_with_bands(pool, 10, 0)
    live: list[FlowRequest] = []
    for step in steps:
        endpoints = pool.snapshot.endpoints
        kind = step[0]
        if kind == "dispatch":
            room = gate.with_room(endpoints, 0)
            if room:
                live.append(dispatch(gate, room[step[1] % len(room)].address))
        elif kind == "complete" and live:
            request = live.pop(step[1] % len(live))
            gate.on_complete(request)
            request.state = State.COMPLETED
        elif kind == "first token" and live:
            gate.on_first_token(live[step[1] % len(live)])
        elif kind == "publish":
            running, waiting = step[1], step[2]
            pool.publish(pool.now + 0.05, a=(running, waiting), b=(waiting, running))
        elif kind == "wait":
            pool.now += step[1]
        for priority in (0, 10):
            known_full = not gate.may_have_room(endpoints, priority)
            assert not known_full or gate.with_room(endpoints, priority) == []


def test_an_idle_server_of_known_size_is_sent_twice_what_it_took_at_each_sample():
    pool, gate = settled_gate(16, 0)  # found full at 16, now runs nothing
    assert send_while_room(gate) == 2  # it took the one waiting at the sample before
    pool.publish(1.3, a=(2, 0))
    assert send_while_room(gate) == 4
    pool.publish(1.35, a=(6, 0))
    assert send_while_room(gate) == 8


# -- latency: a server that slows down without queueing ------------------------


class Histogram:
    """A server's inter-token latency histogram, as its samples show it."""

    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0.0

    def run(self, seconds: float, itl: float, batch: int = 30) -> tuple[float, float]:
        """`seconds` of steps of `itl` for a batch of `batch`; the counters then."""
        tokens = batch * seconds / itl
        self.sum += tokens * itl
        self.count += tokens
        return self.sum, self.count


def test_the_servers_histogram_gives_the_mean_latency_between_two_samples():
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(1.0, 30, 0, 10.0, 500.0), binding=False)
    estimator.observe(sample(1.05, 30, 0, 10.06, 502.0), binding=False)
    assert estimator.latency.itl == pytest.approx(0.03)


def test_the_recent_latency_is_the_token_weighted_mean_forgetting_older_intervals():
    estimator = LimitEstimator(SETTINGS)
    server = Histogram()
    at = 0.0
    for _ in range(100):  # 5 s at 40 ms
        at += 0.05
        estimator.observe(sample(at, 30, 0, *server.run(0.05, 0.04)), binding=False)
    for _ in range(int(3 * RECENT_SECONDS / 0.05)):  # three time constants at 40 ms
        at += 0.05
        estimator.observe(sample(at, 30, 0, *server.run(0.05, 0.12)), binding=False)
    assert 0.10 < estimator.latency.itl < 0.12


def test_a_sample_with_no_new_token_leaves_the_interval_to_the_next():
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(1.0, 30, 0, 10.0, 500.0), binding=False)
    estimator.observe(sample(1.05, 30, 0, 10.0, 500.0), binding=False)  # a long prefill step
    estimator.observe(sample(1.1, 30, 0, 10.6, 530.0), binding=False)
    assert estimator.latency.itl == pytest.approx(0.02)


def test_a_restarted_servers_histogram_starts_a_new_series():
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(1.0, 30, 0, 10.0, 500.0), binding=False)
    estimator.observe(sample(1.05, 30, 0, 10.03, 501.0), binding=False)
    estimator.observe(sample(1.1, 0, 0, 0.05, 1.0), binding=False)  # counters from zero
    assert estimator.latency.itl == pytest.approx(0.03)
    estimator.observe(sample(1.15, 0, 0, 0.09, 2.0), binding=False)
    assert 0.03 < estimator.latency.itl < 0.04


def test_a_server_that_reports_its_histogram_is_not_judged_on_responses():
    estimator = LimitEstimator(SETTINGS)
    estimator.observe(sample(1.0, 30, 0, 10.0, 500.0), binding=False)
    estimator.observe(sample(1.05, 30, 0, 10.06, 502.0), binding=False)
    estimator.latency.observe_response(5.0)
    assert estimator.latency.itl == pytest.approx(0.03)


BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)


def bucketed(at: float, decode: int, prefill: int, before: EndpointMetrics | None = None):
    """A sample `decode` observations of 20 ms and `prefill` of 250 ms after
    `before` (counters from zero without one)."""
    grown = [0.0, decode, decode, decode, decode, decode, decode, decode + prefill]
    total, count = decode * 0.02 + prefill * 0.25, decode + prefill  # 20 ms under 0.025
    if before is not None:
        total += before.itl_sum
        count += before.itl_count
        grown = [g + old for g, old in zip(grown, before.itl_buckets, strict=True)]
    return sample(at, 30, 0, total, count, itl_bounds=BOUNDS, itl_buckets=tuple(grown))


def test_the_servers_buckets_give_the_median_so_long_prefill_steps_do_not_count():
    estimator = LimitEstimator(SETTINGS)
    first = bucketed(1.0, 500, 50)
    estimator.observe(first, binding=False)
    estimator.observe(bucketed(1.05, 90, 10, first), binding=False)
    # The mean of the interval is 43 ms; its median is among the 20 ms steps.
    assert 0.01 < estimator.latency.itl < 0.025
    assert estimator.latency.recent_sum / estimator.latency.recent_count == pytest.approx(0.043)


def test_a_server_whose_buckets_change_bounds_is_read_on_the_new_ones_from_then():
    estimator = LimitEstimator(SETTINGS)
    first = bucketed(1.0, 500, 50)
    estimator.observe(first, binding=False)
    estimator.observe(bucketed(1.05, 90, 10, first), binding=False)
    grown = (first.itl_sum + 10.0, first.itl_count + 200.0)
    other = sample(1.1, 30, 0, *grown, itl_bounds=(0.5,), itl_buckets=(0.0,))
    estimator.observe(other, binding=False)
    assert len(estimator.latency.itl_history) == 1  # started again from this sample
    assert estimator.latency.itl == pytest.approx(
        estimator.latency.recent_sum / estimator.latency.recent_count
    )


def test_the_median_is_interpolated_inside_its_bucket():
    bounds, before = (0.01, 0.02, 0.04), (5.0, 10.0, 10.0)
    assert median_grown(bounds, before, (5.0, 110.0, 110.0), 100.0) == pytest.approx(0.015)
    assert median_grown(bounds, before, (5.0, 35.0, 85.0), 100.0) == pytest.approx(0.03)
    assert median_grown(bounds, before, before, 100.0) == 0.04  # past every bound


def test_the_buckets_median_covers_the_last_recent_window():
    estimator = LimitEstimator(SETTINGS)
    at, latest = 0.0, None
    for _ in range(round(2 * RECENT_WINDOW / 0.05)):  # 20 ms steps, then 250 ms
        at += 0.05
        fast = at < RECENT_WINDOW
        latest = bucketed(at, 150 if fast else 0, 0 if fast else 6, latest)
        estimator.observe(latest, binding=False)
    assert 0.2 < estimator.latency.itl <= 0.3


def test_without_the_histogram_responses_give_the_latency_once_there_are_enough():
    estimator = LimitEstimator(SETTINGS)
    for _ in range(LATENCY_SAMPLES - 1):
        estimator.latency.observe_response(0.04)
    assert not estimator.latency.known()
    estimator.latency.observe_response(0.04)
    assert estimator.latency.known() and estimator.latency.itl == pytest.approx(0.04)


def compared(estimator: LimitEstimator, relative: float, start: float, seconds: float) -> float:
    """Compare `relative` every 50 ms for `seconds` from `start`; the time then."""
    at = start
    for _ in range(round(seconds / 0.05)):
        at += 0.05
        estimator.compare(relative, at)
    return at


def running_full(limit: int) -> tuple[LimitEstimator, float]:
    """Found full at `limit`, a reference of REFERENCE_SPAN seconds as fast
    as the pool; the time then."""
    estimator = found_at(limit)
    return estimator, compared(estimator, 1.0, 2.0, REFERENCE_SPAN + 0.5)


def test_a_server_that_slowed_three_times_more_than_the_pool_holds_a_third_of_its_limit():
    estimator, now = running_full(30)
    assert estimator.compare(3.0, now + 0.05) == 10 - 30
    assert (estimator.limit, estimator.slowed, estimator.probing) == (10, True, False)


def test_a_server_is_not_judged_before_its_reference_spans_enough_time():
    estimator = found_at(30)
    now = compared(estimator, 1.0, 2.0, REFERENCE_SPAN - 0.5)
    assert estimator.compare(3.0, now + 0.05) == 0
    assert not estimator.slowed


def test_a_server_that_slowed_no_more_than_the_pool_keeps_its_limit():
    estimator, now = running_full(30)
    assert estimator.compare(1.5, now + 0.05) == 0
    assert (estimator.limit, estimator.slowed) == (30, False)


def test_a_slower_server_is_judged_against_its_own_speed():
    # Half as fast as the pool's median from the start: its reference.
    estimator = found_at(30)
    now = compared(estimator, 2.0, 2.0, REFERENCE_SPAN + 0.5)
    assert estimator.compare(2.2, now + 0.05) == 0
    assert estimator.compare(6.0, now + 0.1) == 10 - 30


def test_the_latency_of_a_slowed_server_is_not_its_new_reference():
    estimator, now = running_full(30)
    now = compared(estimator, 3.0, now, 30.0)
    assert estimator.latency.reference == pytest.approx(
        1.0, rel=0.02
    )  # the comparison that crossed
    assert estimator.slowed


def test_a_slowed_server_recovers_on_its_steady_latency_once_it_runs_within_its_limit():
    estimator, now = running_full(30)
    estimator.compare(3.0, now + 0.05)
    estimator.running = 25  # still running what it held
    now = compared(estimator, 0.5, now + 0.05, 10.0)
    assert estimator.slowed
    estimator.running = 10
    assert estimator.compare(0.5, now + 0.05) == 0
    assert not estimator.slowed


def test_one_fast_interval_does_not_end_a_slowdown():
    estimator, now = running_full(30)
    now = compared(estimator, 3.0, now, 5.0)
    estimator.running = 10
    estimator.compare(0.5, now + 0.05)
    assert estimator.slowed


def test_a_slowed_server_grows_again_only_once_it_recovers():
    estimator, now = running_full(30)
    estimator.compare(3.0, now + 0.05)
    for step in range(1, 80):  # it still runs what it held, demand waits
        estimator.observe(sample(now + step * 0.1, running=20), binding=True)
    assert (estimator.limit, estimator.probing) == (10, False)
    estimator.running = 10
    compared(estimator, 0.5, now + 8.0, 20.0)
    assert not estimator.slowed
    estimator.observe(sample(now + 30.0, running=10), binding=True)
    estimator.observe(sample(now + 30.1 + SETTINGS.probe_interval, running=10), binding=True)
    assert estimator.probing


def test_the_median_of_the_others_leaves_out_the_value_at_its_position():
    assert [median_without([1.0, 2.0, 3.0, 10.0], i) for i in range(4)] == [3.0, 3.0, 2.0, 2.0]
    assert median_without([1.0, 3.0], 0) == 3.0


def latency_pool(limit: int) -> tuple[Pool, AdaptiveGate]:
    """A gate whose endpoints A and B were both found full at `limit` and run full."""
    pool = Pool(A, B)
    gate = gate_with_bands(pool, 10, 0)
    full, queued = (limit, 0), (limit, 1)
    for at, state in ((0.05, full), (0.1, queued), (1.2, queued), (1.25, full)):
        gate.blocked.update((A, B))
        pool.publish(at, a=state, b=state)
        gate.has_room(A, 0)
    return pool, gate


def serve(
    pool: Pool, gate: AdaptiveGate, itl: dict[str, float], seconds: float, admit: str = ""
) -> None:
    """`seconds` of samples every 50 ms, each server running 30 at its `itl`;
    `admit` takes one more request in every interval."""
    servers = pool.histograms = getattr(pool, "histograms", {A: Histogram(), B: Histogram()})
    for _ in range(round(seconds / 0.05)):
        if admit:
            dispatch(gate, admit)
        pool.publish(
            pool.now + 0.05,
            a=(30, 0, *servers[A].run(0.05, itl[A])),
            b=(30, 0, *servers[B].run(0.05, itl[B])),
        )
        gate.has_room(A, 0)


def test_the_gate_slows_down_the_endpoint_whose_server_slowed_and_not_the_others():
    pool, gate = latency_pool(30)
    serve(pool, gate, {A: 0.04, B: 0.04}, REFERENCE_SPAN + 1.0)
    serve(pool, gate, {A: 0.12, B: 0.04}, 6.0)  # A three times slower, B not
    assert gate.limits()[B] == 30
    assert gate.limits()[A] <= 30 / 2


def test_a_server_whose_steps_mostly_admit_requests_is_not_judged_on_its_latency():
    pool, gate = latency_pool(30)
    serve(pool, gate, {A: 0.04, B: 0.04}, REFERENCE_SPAN + 1.0)
    serve(pool, gate, {A: 0.04, B: 0.04}, 3.0, admit=A)  # a prefill at almost every step
    serve(pool, gate, {A: 0.12, B: 0.04}, 6.0, admit=A)  # they lengthen its steps
    assert gate.limits() == {A: 30, B: 30}


def test_a_pool_that_slows_alike_keeps_its_limits():
    pool, gate = latency_pool(30)
    serve(pool, gate, {A: 0.04, B: 0.04}, REFERENCE_SPAN + 1.0)
    serve(pool, gate, {A: 0.12, B: 0.12}, 10.0)
    assert gate.limits() == {A: 30, B: 30}


def test_a_top_band_request_skips_a_slowed_endpoint_while_another_did_not_slow():
    pool, gate = latency_pool(30)
    serve(pool, gate, {A: 0.04, B: 0.04}, REFERENCE_SPAN + 1.0)
    serve(pool, gate, {A: 0.12, B: 0.04}, 6.0)
    pool.publish(pool.now + 0.05, a=(5, 0), b=(5, 0))  # both with room
    assert not gate.has_room(A, 10) and gate.has_room(B, 10)
    assert gate.has_room(A, 0)  # the lower bands fill it


def test_when_every_endpoint_slowed_the_top_band_takes_them_too():
    pool, gate = latency_pool(30)
    for estimator in gate._estimators.values():
        estimator.slowed = True
    pool.publish(pool.now + 0.05, a=(5, 0), b=(5, 0))
    assert gate.has_room(A, 10) and gate.has_room(B, 10)
