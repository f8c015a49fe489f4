from hypothesis import given, settings
from hypothesis import strategies as st

from epp.scheduling.cache_scorers import PrefixCacheScorer
from epp.scheduling.endpoint import Endpoint, EndpointMetrics
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import (
    KVCacheScorer,
    LoraAffinityScorer,
    QueueScorer,
    RunningRequestsScorer,
    lower_is_better,
)

REQUEST = InferenceRequest(model="m", target_model="m")


def endpoint(index: int, **metrics) -> Endpoint:
    return Endpoint(f"e{index}", f"10.0.0.{index}:8000", metrics=EndpointMetrics(**metrics))


def test_queue_score_is_min_max_normalised():
    pool = [endpoint(1, waiting=0), endpoint(2, waiting=5), endpoint(3, waiting=10)]
    assert QueueScorer().score(REQUEST, pool) == [1.0, 0.5, 0.0]


def test_equal_queues_all_score_one():
    pool = [endpoint(1, waiting=3), endpoint(2, waiting=3)]
    assert QueueScorer().score(REQUEST, pool) == [1.0, 1.0]


def test_queue_counts_requests_sent_since_the_last_scrape():
    pool = [endpoint(1, waiting=0, updated_at=1.0), endpoint(2, waiting=1, updated_at=1.0)]
    scorer = QueueScorer()
    scorer.picked(REQUEST, pool[0])
    scorer.picked(REQUEST, pool[0])
    assert scorer.score(REQUEST, pool) == [0.0, 1.0]


def test_a_new_scrape_resets_the_requests_sent_since():
    scraped = endpoint(1, waiting=0, updated_at=1.0)
    scorer = QueueScorer()
    scorer.picked(REQUEST, scraped)
    rescraped = endpoint(1, waiting=0, updated_at=2.0)
    assert scorer.score(REQUEST, [rescraped, endpoint(2, waiting=0)]) == [1.0, 1.0]


def test_kv_cache_score_is_the_free_fraction():
    pool = [endpoint(1, kv_usage=0.25), endpoint(2, kv_usage=1.0)]
    assert KVCacheScorer().score(REQUEST, pool) == [0.75, 0.0]


def test_fewer_running_requests_score_higher():
    pool = [endpoint(1, running=2), endpoint(2, running=6)]
    assert RunningRequestsScorer().score(REQUEST, pool) == [1.0, 0.0]


def test_lora_affinity_prefers_active_then_free_slot_then_waiting():
    request = InferenceRequest(model="base", target_model="sql")
    pool = [
        endpoint(1, lora_running=frozenset({"sql"}), lora_max=1),
        endpoint(2, lora_running=frozenset({"chat"}), lora_max=2),
        endpoint(3, lora_running=frozenset({"chat"}), lora_waiting=frozenset({"sql"}), lora_max=1),
        endpoint(4, lora_running=frozenset({"chat"}), lora_max=1),
    ]
    assert LoraAffinityScorer().score(request, pool) == [1.0, 0.8, 0.6, 0.0]


def prefix_scorer() -> PrefixCacheScorer:
    return PrefixCacheScorer(block_chars=4, max_blocks=64, lru_capacity=1000)


def test_prefix_score_is_the_matched_fraction_of_blocks():
    scorer = prefix_scorer()
    pool = [endpoint(1), endpoint(2)]
    scorer.picked(InferenceRequest("m", "m", prompt="aaaabbbb"), pool[0])
    request = InferenceRequest("m", "m", prompt="aaaabbbbccccdddd")
    assert scorer.score(request, pool) == [0.5, 0.0]


def test_a_prompt_shorter_than_one_block_scores_zero_everywhere():
    scorer = prefix_scorer()
    pool = [endpoint(1)]
    scorer.picked(InferenceRequest("m", "m", prompt="abc"), pool[0])
    assert scorer.score(InferenceRequest("m", "m", prompt="abc"), pool) == [0.0]


def test_prefix_hashes_are_cached_on_the_request():
    scorer = prefix_scorer()
    request = InferenceRequest("m", "m", prompt="aaaabbbb")
    first = scorer.hashes(request)
    request.prompt = "changed!"
    assert scorer.hashes(request) is first


def test_prefix_hashes_cached_for_another_block_size_are_recomputed():
    request = InferenceRequest("m", "m", prompt="aaaabbbb")
    prefix_scorer().hashes(request)
    other = PrefixCacheScorer(block_chars=8, max_blocks=64, lru_capacity=1000)
    assert len(other.hashes(request)) == 1


def test_a_forgotten_endpoint_loses_its_prefixes():
    scorer = prefix_scorer()
    pool = [endpoint(1)]
    request = InferenceRequest("m", "m", prompt="aaaabbbb")
    scorer.picked(request, pool[0])
    scorer.forget(pool[0].address)
    assert scorer.score(request, pool) == [0.0]


@settings(max_examples=200, deadline=None)
@given(
    waiting=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 5), max_size=30),
)
def test_queue_scores_after_picks_equal_scores_computed_afresh(waiting, picks):
    pool = [endpoint(index, waiting=count) for index, count in enumerate(waiting)]
    scorer, loads = QueueScorer(), list(map(float, waiting))
    for pick in picks:
        scorer.score(REQUEST, pool)
        chosen = pick % len(pool)
        scorer.picked(REQUEST, pool[chosen])
        loads[chosen] += 1
        assert scorer.score(REQUEST, pool) == lower_is_better(loads)
