import random

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.config import ProfileConfig, SchedulingConfig, ScorerConfig
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.filters import decode_filter
from epp.scheduling.pickers import max_score_picker
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import (
    Scheduler,
    add_named,
    pair_sum,
    pair_with_column,
    with_column,
)
from epp.scheduling.scorers import kv_cache_scorer, queue_scorer
from epp.scheduling.spec import PluginSpec

NOW = 100.0
PROMPT = "You are a helpful assistant. " * 20


def endpoint(index: int, **metrics) -> Endpoint:
    metrics.setdefault("updated_at", NOW)
    return Endpoint(f"e{index}", f"10.0.0.{index}:8000", metrics=EndpointMetrics(**metrics))


def pool_of(*endpoints: Endpoint, membership: int = 1) -> PoolSnapshot:
    return PoolSnapshot(endpoints=endpoints, version=membership, membership=membership)


DEFAULT = SchedulingConfig()


def scheduler(pool, config=DEFAULT, gate=None, seed=1) -> Scheduler:
    return Scheduler(config, lambda: pool, lambda: NOW, random.Random(seed), gate)


def flow_request(prompt: str = PROMPT, subset=None, request_id: str = "r") -> FlowRequest:
    return FlowRequest(
        request_id=request_id,
        fairness_id="f",
        priority=0,
        arrival=NOW,
        payload=InferenceRequest("m", "m", prompt=prompt, subset=subset),
    )


def test_places_on_the_least_loaded_endpoint():
    pool = pool_of(endpoint(1, waiting=3, kv_usage=0.5), endpoint(2, waiting=0, kv_usage=0.1))
    assert scheduler(pool).place(flow_request()) == "10.0.0.2:8000"


def test_a_repeated_prompt_goes_to_the_same_endpoint():
    pool = pool_of(*(endpoint(index) for index in range(1, 9)))
    placer = scheduler(pool)
    first = placer.place(flow_request(request_id="a"))
    assert all(placer.place(flow_request(request_id=str(n))) == first for n in range(10))


def test_different_prompts_spread_over_idle_endpoints():
    pool = pool_of(*(endpoint(index) for index in range(1, 9)))
    placer = scheduler(pool)
    chosen = {placer.place(flow_request(prompt=f"{n:04d}" * 100)) for n in range(16)}
    assert len(chosen) > 1


def test_a_stale_endpoint_is_avoided():
    pool = pool_of(endpoint(1, updated_at=NOW - 5.0), endpoint(2, waiting=4, kv_usage=0.7))
    assert {scheduler(pool, seed=s).place(flow_request()) for s in range(20)} == {"10.0.0.2:8000"}


def test_a_failing_endpoint_is_avoided():
    pool = pool_of(endpoint(1, failing=True), endpoint(2, waiting=4))
    assert {scheduler(pool, seed=s).place(flow_request()) for s in range(20)} == {"10.0.0.2:8000"}


def test_a_saturated_endpoint_is_avoided():
    pool = pool_of(endpoint(1, kv_usage=0.9), endpoint(2, waiting=4, kv_usage=0.5))
    assert {scheduler(pool, seed=s).place(flow_request()) for s in range(20)} == {"10.0.0.2:8000"}


def test_when_every_endpoint_is_stale_all_stay_candidates():
    pool = pool_of(endpoint(1, updated_at=None), endpoint(2, updated_at=NOW - 9.0, waiting=2))
    assert scheduler(pool).place(flow_request()) == "10.0.0.1:8000"


def test_the_subset_hint_keeps_only_listed_ips():
    pool = pool_of(endpoint(1), endpoint(2, waiting=4), endpoint(3))
    placed = {
        scheduler(pool, seed=s).place(flow_request(subset=frozenset({"10.0.0.2"})))
        for s in range(10)
    }
    assert placed == {"10.0.0.2:8000"}


def test_a_subset_hint_matching_nothing_rejects_with_no_endpoints():
    pool = pool_of(endpoint(1))
    placement = scheduler(pool).place(flow_request(subset=frozenset({"10.9.9.9"})))
    assert placement is Outcome.REJECTED_NO_ENDPOINTS


def test_an_empty_subset_hint_rejects_with_no_endpoints():
    pool = pool_of(endpoint(1))
    assert scheduler(pool).place(flow_request(subset=frozenset())) is Outcome.REJECTED_NO_ENDPOINTS


def full_gate(*addresses: str, limit: int = 1) -> ConcurrencyGate:
    gate = ConcurrencyGate(max_per_endpoint=limit)
    for index, address in enumerate(addresses):
        held = FlowRequest(f"held-{index}", "f", 0, NOW)
        held.endpoint = address
        gate.on_dispatch(held)
    return gate


def test_an_endpoint_without_credits_is_not_chosen():
    pool = pool_of(endpoint(1), endpoint(2, waiting=4, kv_usage=0.7))
    gate = full_gate("10.0.0.1:8000")
    assert scheduler(pool, gate=gate).place(flow_request()) == "10.0.0.2:8000"


def test_no_credits_anywhere_makes_the_request_wait():
    pool = pool_of(endpoint(1), endpoint(2))
    gate = full_gate("10.0.0.1:8000", "10.0.0.2:8000")
    assert scheduler(pool, gate=gate).place(flow_request()) is None


def test_a_failing_endpoint_with_credits_is_not_used_while_healthy_ones_are_full():
    pool = pool_of(endpoint(1), endpoint(2, failing=True))
    gate = full_gate("10.0.0.1:8000")
    assert scheduler(pool, gate=gate).place(flow_request()) is None


def test_when_no_endpoint_is_healthy_a_saturated_one_goes_before_a_failing_one():
    pool = pool_of(endpoint(1, failing=True), endpoint(2, waiting=50, kv_usage=0.95))
    assert {scheduler(pool, seed=s).place(flow_request()) for s in range(20)} == {"10.0.0.2:8000"}


def test_credits_bound_a_stale_pool_too():
    pool = pool_of(endpoint(1, updated_at=None), endpoint(2, updated_at=None))
    gate = full_gate("10.0.0.1:8000")
    assert scheduler(pool, gate=gate).place(flow_request()) == "10.0.0.2:8000"


def test_an_empty_pool_makes_the_request_wait():
    placer = scheduler(pool_of())
    assert placer.place(flow_request()) is None
    assert not placer.has_endpoints()


def test_a_request_without_payload_is_placed():
    request = FlowRequest("r", "f", 0, NOW)
    assert scheduler(pool_of(endpoint(1))).place(request) == "10.0.0.1:8000"


def test_scores_are_weighted_and_summed():
    config = SchedulingConfig(
        profiles=(
            ProfileConfig(
                scorers=(
                    ScorerConfig(PluginSpec("queue", queue_scorer), 2.0),
                    ScorerConfig(PluginSpec("kv", kv_cache_scorer)),
                )
            ),
        )
    )
    pool = pool_of(endpoint(1, waiting=0, kv_usage=0.5), endpoint(2, waiting=4, kv_usage=0.0))
    placer = scheduler(pool, config=config)
    assert placer.total_scores(InferenceRequest("m", "m"), pool.endpoints) == [2.5, 1.0]


def test_prefixes_of_an_endpoint_that_left_are_forgotten():
    first = pool_of(endpoint(1), endpoint(2), membership=1)
    current = [first]
    placer = Scheduler(SchedulingConfig(), lambda: current[0], lambda: NOW, random.Random(1))
    chosen = placer.place(flow_request())
    remaining = [e for e in first.endpoints if e.address != chosen]
    current[0] = pool_of(*remaining, membership=2)
    placer.place(flow_request(prompt="x" * 10))
    prefix = placer.scorers[2][1]
    assert prefix.score(InferenceRequest("m", "m", prompt=PROMPT), first.endpoints) == [0.0, 0.0]


def test_a_plugin_timer_times_each_filter_scorer_and_picker_call_by_type_and_name():
    calls: list[tuple[str, str, str]] = []

    def timer(point, plugin_type, name, call):
        def timed(*args):
            calls.append((point, plugin_type, name))
            return call(*args)

        return timed

    profile = ProfileConfig(
        filters=(PluginSpec("decoders", decode_filter, type="decode-filter"),),
        scorers=(ScorerConfig(PluginSpec("q", queue_scorer, type="queue-scorer")),),
        picker=PluginSpec("max-score-picker", max_score_picker),
    )
    pool = pool_of(endpoint(1), endpoint(2))
    placer = Scheduler(
        SchedulingConfig(profiles=(profile,)),
        lambda: pool,
        lambda: NOW,
        random.Random(1),
        plugin_timer=timer,
    )
    placer.place(flow_request())
    assert calls == [
        ("Filter", "decode-filter", "decoders"),
        ("Scorer", "queue-scorer", "q"),
        ("Picker", "max-score-picker", "max-score-picker"),
    ]


def test_with_no_fresh_endpoint_the_same_reachable_list_is_scored_until_the_pool_changes():
    stale = pool_of(endpoint(1, updated_at=None), endpoint(2, updated_at=None, failing=True))
    pools = [stale]
    placer = Scheduler(DEFAULT, lambda: pools[0], lambda: NOW, random.Random(1))
    placer.place(flow_request(request_id="a"))
    first = placer.reachable_now()
    placer.place(flow_request(request_id="b"))
    assert placer.reachable_now() is first
    assert [e.address for e in first] == ["10.0.0.1:8000"]
    pools[0] = pool_of(endpoint(1, updated_at=None), endpoint(3, updated_at=None), membership=2)
    placer.place(flow_request(request_id="c"))
    assert [e.address for e in placer.reachable_now()] == ["10.0.0.1:8000", "10.0.0.3:8000"]


ADDRESSES = [f"10.0.0.{index}:8000" for index in range(1, 9)]


@given(
    totals=st.lists(st.floats(-10, 10), min_size=8, max_size=8),
    weight=st.floats(-5, 5),
    named=st.dictionaries(
        st.sampled_from([*ADDRESSES, "10.9.9.9:8000"]), st.floats(0, 1), max_size=9
    ),
)
def test_a_sparse_column_added_whole_gives_the_totals_of_adding_it_name_by_name(
    totals, weight, named
):
    by_name = list(totals)
    add_named(by_name, weight, named, {address: i for i, address in enumerate(ADDRESSES)})
    assert with_column(totals, weight, named, ADDRESSES) == by_name


@given(
    first=st.lists(st.floats(0, 1), min_size=8, max_size=8),
    second=st.lists(st.floats(0, 1), min_size=8, max_size=8),
    weights=st.tuples(st.floats(-5, 5), st.floats(-5, 5), st.floats(-5, 5)),
    named=st.dictionaries(
        st.sampled_from([*ADDRESSES, "10.9.9.9:8000"]), st.floats(0, 1), max_size=9
    ),
)
def test_a_pair_and_a_column_summed_in_one_pass_give_the_totals_to_the_last_bit(
    first, second, weights, named
):
    w1, w2, weight = weights
    in_two = with_column(pair_sum(w1, first, w2, second), weight, named, ADDRESSES)
    assert pair_with_column(w1, first, w2, second, weight, named, ADDRESSES) == in_two


class MovingScorer:
    """Scores 1 for one endpoint and 0 for the others; a pick moves the 1
    to the next endpoint, in the list it returned."""

    def __init__(self) -> None:
        self._of = None
        self._scores: list[float] = []

    def score(self, request, endpoints):
        if endpoints is not self._of:
            self._of = endpoints
            self._scores = [1.0] + [0.0] * (len(endpoints) - 1)
        return self._scores

    def picked(self, request, endpoint) -> None:
        scores = self._scores
        top = scores.index(1.0)
        scores[top] = 0.0
        scores[(top + 1) % len(scores)] = 1.0

    def forget(self, address: str) -> None:
        pass


def test_a_pick_that_changes_another_endpoints_score_is_followed():
    config = SchedulingConfig(
        profiles=(
            ProfileConfig(
                scorers=(
                    ScorerConfig(PluginSpec("moving", lambda context: MovingScorer())),
                    ScorerConfig(PluginSpec("kv", kv_cache_scorer)),
                )
            ),
        )
    )
    pool = pool_of(*(endpoint(index, kv_usage=0.5) for index in range(1, 5)))
    placer = scheduler(pool, config=config)
    placed = [placer.place(flow_request(request_id=str(n))) for n in range(6)]
    assert placed == [f"10.0.0.{index}:8000" for index in (1, 2, 3, 4, 1, 2)]


PROMPTS = (PROMPT, PROMPT + "and concise. " * 10, "Translate this text. " * 30, "hi")


def rewrapped(pool: PoolSnapshot, version: int) -> PoolSnapshot:
    """The same endpoints in a new snapshot: nothing kept for the old one's
    candidates applies."""
    return PoolSnapshot(endpoints=tuple(pool.endpoints), version=version, membership=1)


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.25, 0.5])), min_size=2, max_size=8
    ),
    stale=st.booleans(),
    steps=st.lists(st.tuples(st.integers(0, len(PROMPTS) - 1), st.booleans()), max_size=60),
)
def test_totals_kept_between_picks_equal_totals_summed_afresh(loads, stale, steps):
    # One scheduler keeps its totals, scores and matches across picks on an
    # unchanged pool; the other sees the same endpoints in a new snapshot
    # each time and asks its prefix index for another prompt between picks,
    # so it sums everything afresh. Same totals to the last bit, same picks
    # (ties drawn alike), also across a read that changes one endpoint.
    updated = None if stale else NOW
    endpoints = [
        endpoint(index, waiting=waiting, kv_usage=kv, updated_at=updated)
        for index, (waiting, kv) in enumerate(loads, start=1)
    ]
    kept_pool, fresh_pool = [pool_of(*endpoints)], [pool_of(*endpoints)]
    kept = Scheduler(DEFAULT, lambda: kept_pool[0], lambda: NOW, random.Random(7))
    fresh = Scheduler(DEFAULT, lambda: fresh_pool[0], lambda: NOW, random.Random(7))
    other = InferenceRequest("m", "m", prompt="unrelated " * 40)
    candidates: list[Endpoint] = []
    for step, (prompt, read) in enumerate(steps, start=2):
        if read:  # one endpoint read again: a new object in a new snapshot
            position = step % len(endpoints)
            endpoints[position] = endpoint(position + 1, waiting=step % 3, updated_at=updated)
            kept_pool[0] = PoolSnapshot(endpoints=tuple(endpoints), version=step, membership=1)
        fresh_pool[0] = rewrapped(kept_pool[0], 1000 + step)
        fresh.scorers[2][1].matches(other)
        request = flow_request(prompt=PROMPTS[prompt], request_id=str(step))
        again = flow_request(prompt=PROMPTS[prompt], request_id=str(step))
        if candidates and not read:  # the candidates of the latest pick, still the pool's
            ours = kept.total_scores(request.payload, candidates)
            theirs = fresh.total_scores(again.payload, list(candidates))
            assert [total.hex() for total in ours] == [total.hex() for total in theirs]
        assert kept.place(request) == fresh.place(again)
        candidates = kept.healthy_now or kept.reachable_now()
