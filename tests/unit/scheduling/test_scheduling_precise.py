"""Precise prefix-cache routing through the core: a reference configuration
with the precise producer, the servers' events fed to the core, requests
with their tokens."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from epp.config.loader import EppConfig, load_config, parse_config
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.cache_scorers import PrecisePrefixCacheScorer
from epp.scheduling.core import Core, build_core
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.kvblocks import AllBlocksCleared, BlockHasher, BlockStored
from epp.scheduling.request import UNMEASURED, InferenceRequest, PrefixMatch

SAMPLES = Path(__file__).parents[2] / "data" / "reference_configs"
NOW = 100.0
TOKENS = list(range(1000, 1000 + 16 * 8))


def endpoint(index: int) -> Endpoint:
    return Endpoint(f"e{index}", f"10.0.0.{index}:8000", metrics=EndpointMetrics(updated_at=NOW))


class Pool:
    def __init__(self, *endpoints: Endpoint) -> None:
        self.snapshot = PoolSnapshot(endpoints=endpoints, version=1, membership=1)

    def __call__(self) -> PoolSnapshot:
        return self.snapshot

    def set(self, *endpoints: Endpoint) -> None:
        version = self.snapshot.version + 1
        self.snapshot = PoolSnapshot(endpoints=endpoints, version=version, membership=version)


PRECISE = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: {block}, hashSeed: "{seed}"}}
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: decode-filter
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 10
"""


def precise_config(block: int = 16, seed: str = "") -> EppConfig:
    return parse_config(yaml.safe_load(PRECISE.format(block=block, seed=seed)))


def core_for(sample: str | EppConfig, pool: Pool) -> Core:
    config = load_config(SAMPLES / sample) if isinstance(sample, str) else sample
    return build_core(config.flow_control, config.scheduling, pool, lambda: NOW, random.Random(3))


def choose(core: Core, tokens: list[int] | None) -> str:
    request = InferenceRequest("m", "m", prompt="ignored", token_ids=tokens)
    chosen = core.scheduler.choose(request)
    assert isinstance(chosen, Endpoint)
    return chosen.address


def keys(tokens: list[int], seed: str = "") -> tuple[int, ...]:
    return BlockHasher(16, seed).keys(tokens)


def test_a_config_naming_the_precise_producer_scores_with_the_precise_index() -> None:
    core = core_for(precise_config(), Pool(endpoint(1), endpoint(2)))
    assert core.kv_index is not None
    scorers = [s for _, s in core.scheduler.scorers]
    assert any(isinstance(s, PrecisePrefixCacheScorer) for s in scorers)


def test_requests_go_where_the_servers_report_their_prompts_blocks() -> None:
    pool = Pool(endpoint(1), endpoint(2), endpoint(3))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS)[:6])])
    core.kv_events("10.0.0.3:8000", [BlockStored(keys(TOKENS)[:2])])
    for _ in range(5):
        assert choose(core, TOKENS) == "10.0.0.2:8000"


def test_a_placed_request_carries_what_the_index_predicted_for_its_endpoint() -> None:
    core = core_for(precise_config(), Pool(endpoint(1), endpoint(2)))
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS)[:6])])
    request = InferenceRequest("m", "m", token_ids=TOKENS)
    core.scheduler.choose(request)
    producer = "precise-prefix-cache-producer"
    assert request.prefix_match == PrefixMatch(producer, producer, 6, 8, 16, len(TOKENS))
    assert request.prefix_match.cached_tokens == 96


def test_a_prompt_known_by_its_leading_tokens_scores_the_share_of_the_whole_prompt_held() -> None:
    # the token producer's prefix store may give a prompt's leading tokens
    # only, with input_tokens counting the whole prompt
    core = core_for(precise_config(), Pool(endpoint(1), endpoint(2)))
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS)[:4])])
    scorer = next(s for _, s in core.scheduler.scorers if isinstance(s, PrecisePrefixCacheScorer))
    leading = InferenceRequest("m", "m", token_ids=TOKENS[:80], input_tokens=len(TOKENS))
    whole = InferenceRequest("m", "m", token_ids=TOKENS, input_tokens=len(TOKENS))
    assert scorer.sparse_scores(leading) == scorer.sparse_scores(whole) == {"10.0.0.2:8000": 0.5}


def test_the_approximate_index_predicts_the_blocks_it_sent_the_endpoint_before() -> None:
    core = core_for(EppConfig(), Pool(endpoint(1), endpoint(2)))
    prompt = "p" * 64 * 5 + "tail"
    first, second = (InferenceRequest("m", "m", prompt=prompt, input_tokens=81) for _ in "12")
    assert core.scheduler.choose(first) == core.scheduler.choose(second)
    producer = "approx-prefix-cache-producer"
    assert first.prefix_match == PrefixMatch(producer, producer, 0, 5, 16, 81)
    assert second.prefix_match == PrefixMatch(producer, producer, 5, 5, 16, 81)


def test_a_request_that_wants_no_prefix_metrics_keeps_its_unmeasured_match() -> None:
    core = core_for(EppConfig(), Pool(endpoint(1), endpoint(2)))
    prompt = "p" * 64 * 5 + "tail"
    first, second = (
        InferenceRequest("m", "m", prompt=prompt, input_tokens=81, prefix_match=UNMEASURED)
        for _ in "12"
    )
    assert core.scheduler.choose(first) == core.scheduler.choose(second)
    assert first.prefix_match is UNMEASURED
    assert second.prefix_match is UNMEASURED


def test_the_servers_hash_seed_from_the_config_is_used() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(seed="42"), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS, "42"))])
    scorer = next(s for _, s in core.scheduler.scorers if isinstance(s, PrecisePrefixCacheScorer))
    request = InferenceRequest("m", "m", token_ids=TOKENS)
    assert scorer.matches(request) == {"10.0.0.2:8000": 8}
    core.kv_events("10.0.0.1:8000", [BlockStored(keys(TOKENS, ""))])
    assert scorer.matches(InferenceRequest("m", "m", token_ids=TOKENS)) == {"10.0.0.2:8000": 8}


def test_a_request_without_tokens_matches_nothing() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    scorer = next(s for _, s in core.scheduler.scorers if isinstance(s, PrecisePrefixCacheScorer))
    assert scorer.matches(InferenceRequest("m", "m", prompt="x" * 4000)) == {}


def test_after_all_blocks_cleared_the_endpoint_no_longer_attracts_what_another_holds_as_deep() -> (
    None
):
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    core.kv_events("10.0.0.1:8000", [BlockStored(keys(TOKENS)[:6])])
    assert choose(core, TOKENS) == "10.0.0.2:8000"
    core.kv_events("10.0.0.2:8000", [AllBlocksCleared()])
    assert choose(core, TOKENS[:96]) == "10.0.0.1:8000"  # its 6 blocks, held as deep there


def test_a_session_no_endpoint_holds_now_goes_back_to_the_one_that_held_it_before_its_restart() -> (
    None
):
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    core.kv_events("10.0.0.1:8000", [BlockStored(keys(TOKENS)[:3])])  # a shared system prompt
    core.kv_events("10.0.0.2:8000", [AllBlocksCleared()])
    request = InferenceRequest("m", "m", token_ids=[*TOKENS, *range(16)])  # the next turn
    chosen = core.scheduler.choose(request)
    assert isinstance(chosen, Endpoint) and chosen.address == "10.0.0.2:8000"
    assert request.prefix_match is not None and request.prefix_match.matched == 0
    assert choose(core, TOKENS[:48]) == "10.0.0.1:8000"  # the system prompt alone: held there


def test_a_server_whose_publisher_restarted_is_the_former_home_of_its_sessions() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    core.kv_events("10.0.0.1:8000", [BlockStored(keys(TOKENS)[:2])])
    core.kv_endpoint_reset("10.0.0.2:8000")  # its subscriber saw a new process
    assert core.kv_index is not None and core.kv_index.held_by("10.0.0.2:8000") == 0
    assert choose(core, [*TOKENS, *range(16)]) == "10.0.0.2:8000"


def test_an_endpoint_that_leaves_the_pool_takes_its_blocks_with_it() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    assert choose(core, TOKENS) == "10.0.0.2:8000"
    pool.set(endpoint(1))
    assert choose(core, TOKENS) == "10.0.0.1:8000"
    assert core.kv_index is not None
    assert core.kv_index.held_by("10.0.0.2:8000") == 0


def test_a_reload_keeps_what_the_index_learned() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(), pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    config = precise_config()
    core.reschedule(config.scheduling, random.Random(4))
    assert choose(core, TOKENS) == "10.0.0.2:8000"


def test_without_a_precise_producer_events_are_dropped() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for("epp-config.yaml", pool)
    core.kv_events("10.0.0.2:8000", [BlockStored(keys(TOKENS))])
    assert core.kv_index is None


def test_the_flow_controller_places_a_precise_request_end_to_end() -> None:
    pool = Pool(endpoint(1), endpoint(2))
    core = core_for(precise_config(block=64), pool)
    core.kv_events("10.0.0.1:8000", [BlockStored(BlockHasher(64).keys(TOKENS))])
    request = FlowRequest(
        request_id="r",
        fairness_id="f",
        priority=0,
        arrival=NOW,
        payload=InferenceRequest("m", "m", token_ids=TOKENS),
    )
    assert core.scheduler.place(request) == "10.0.0.1:8000"
