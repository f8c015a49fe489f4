"""The approx-prefix-cache-producer's `autoTune`, as the reference's
producer applies it: the block size the endpoints report (at least 64
tokens), blocks per prompt from `maxPrefixTokensToMatch` over it, and each
endpoint's KV-cache block count as its capacity in the index."""

from __future__ import annotations

import random
from typing import Any

from epp.config.loader import parse_config
from epp.scheduling.cache_scorers import PrefixCacheScorer
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.prefix import PrefixIndex
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler

HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
NOW = 100.0


def pod(index: int, block_size: int | None = None, num_gpu_blocks: int | None = None) -> Endpoint:
    metrics = EndpointMetrics(updated_at=NOW, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
    return Endpoint(f"p{index}", f"10.0.0.{index}:8000", {}, metrics)


def producer(**parameters: Any) -> dict[str, Any]:
    return {
        "plugins": [
            {"type": "approx-prefix-cache-producer", "parameters": parameters},
            {"type": "prefix-cache-scorer"},
        ],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "prefix-cache-scorer"}]}],
    }


def prefix_scorer(document: dict[str, Any], *pods: Endpoint) -> PrefixCacheScorer:
    config = parse_config({**HEAD, **document}).scheduling
    pool = PoolSnapshot(endpoints=pods, version=1, membership=1)
    scheduler = Scheduler(config, lambda: pool, lambda: NOW, random.Random(1))
    (_, scorer), *_ = scheduler.scorers
    assert isinstance(scorer, PrefixCacheScorer)
    return scorer


def hashed_with(scorer: PrefixCacheScorer) -> tuple[int, int]:
    """(block characters, blocks per prompt) a request is hashed with."""
    request = InferenceRequest("m", "m", prompt="x" * 10_000)
    scorer.hashes(request)
    assert request.prefix_hashes is not None
    return request.prefix_hashes[0], request.prefix_hashes[1]


def test_auto_tuned_blocks_take_the_reported_block_size():
    scorer = prefix_scorer(producer(), pod(1, block_size=128))
    assert hashed_with(scorer) == (128 * 4, 131_072 // 128)


def test_an_auto_tuned_block_is_at_least_64_tokens():
    scorer = prefix_scorer(producer(), pod(1, block_size=16))
    assert hashed_with(scorer)[0] == 64 * 4


def test_auto_tuning_without_a_reported_block_size_keeps_the_configured_one():
    scorer = prefix_scorer(producer(blockSizeTokens=32), pod(1))
    assert hashed_with(scorer)[0] == 32 * 4


def test_without_auto_tuning_the_configured_block_size_holds():
    scorer = prefix_scorer(producer(autoTune=False), pod(1, block_size=128))
    assert hashed_with(scorer)[0] == 16 * 4


def test_an_auto_tuned_endpoint_keeps_as_many_blocks_as_its_kv_cache_reports():
    small = pod(1, num_gpu_blocks=4)
    scorer = prefix_scorer(producer(blockSizeTokens=1, maxPrefixTokensToMatch=0), small)
    first = InferenceRequest("m", "m", prompt="a" * 8)  # two 4-character blocks
    scorer.picked(first, small)
    for letter in "bcd":
        scorer.picked(InferenceRequest("m", "m", prompt=letter * 8), small)
    assert scorer.matched_blocks(InferenceRequest("m", "m", prompt="a" * 8), small.address) == 0


def test_without_auto_tuning_the_configured_capacity_holds():
    small = pod(1, num_gpu_blocks=4)
    document = producer(autoTune=False, blockSizeTokens=1, maxPrefixTokensToMatch=0)
    scorer = prefix_scorer(document, small)
    scorer.picked(InferenceRequest("m", "m", prompt="a" * 8), small)
    for letter in "bcd":
        scorer.picked(InferenceRequest("m", "m", prompt=letter * 8), small)
    assert scorer.matched_blocks(InferenceRequest("m", "m", prompt="a" * 8), small.address) == 2


def test_an_index_capacity_given_per_record_bounds_that_endpoint():
    index = PrefixIndex(1000)
    index.record("e", (1, 2), capacity=2)
    index.record("e", (3, 4), capacity=2)
    index.record("e", (5, 6), capacity=2)
    assert "e" not in index.matches((1, 2))
