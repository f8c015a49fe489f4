"""`maxNumOfEndpoints` > 1: the destination profile's picker ranks the
candidates and the next ones after the destination become its fallbacks
(`x-gateway-destination-endpoint: dest,fallback,...`, as the reference's
picker returns several endpoints)."""

from __future__ import annotations

import random
from typing import Any

from epp.config.loader import parse_config
from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.pickers import MaxScorePicker, RandomPicker, WeightedRandomPicker
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler

NOW = 100.0
HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def pod(index: int, waiting: float) -> Endpoint:
    metrics = EndpointMetrics(waiting=waiting, updated_at=NOW)
    return Endpoint(f"p{index}", f"10.0.0.{index}:8000", {}, metrics)


def queue_profile(picker: str, count: int) -> dict[str, Any]:
    return {
        "plugins": [
            {"type": "queue-scorer"},
            {"type": picker, "parameters": {"maxNumOfEndpoints": count}},
        ],
        "schedulingProfiles": [
            {"name": "p", "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": picker}]}
        ],
    }


def scheduler_for(document: dict[str, Any], *pods: Endpoint, gate=None) -> Scheduler:
    config = parse_config({**HEAD, **document}).scheduling
    pool = PoolSnapshot(endpoints=pods, version=1, membership=1)
    return Scheduler(config, lambda: pool, lambda: NOW, random.Random(3), gate)


POOL = (pod(1, waiting=3), pod(2, waiting=0), pod(3, waiting=1), pod(4, waiting=2))


def test_max_score_fallbacks_are_the_next_best_endpoints():
    placer = scheduler_for(queue_profile("max-score-picker", 3), *POOL)
    request = InferenceRequest("m", "m")
    chosen = placer.choose(request)
    assert chosen.address == "10.0.0.2:8000"
    assert request.fallbacks == ("10.0.0.3:8000", "10.0.0.4:8000")


def test_one_endpoint_per_request_has_no_fallbacks():
    placer = scheduler_for(queue_profile("max-score-picker", 1), *POOL)
    request = InferenceRequest("m", "m")
    placer.choose(request)
    assert request.fallbacks == ()


def test_fallbacks_are_at_most_the_other_candidates():
    placer = scheduler_for(queue_profile("random-picker", 10), *POOL)
    request = InferenceRequest("m", "m")
    chosen = placer.choose(request)
    assert sorted((chosen.address, *request.fallbacks)) == sorted(p.address for p in POOL)


def test_an_endpoint_without_a_credit_is_still_a_fallback():
    gate = ConcurrencyGate(max_per_endpoint=1)
    busy = FlowRequest("busy", "f", 0, NOW)
    busy.endpoint = "10.0.0.2:8000"
    gate.on_dispatch(busy)
    placer = scheduler_for(queue_profile("max-score-picker", 2), *POOL, gate=gate)
    request = InferenceRequest("m", "m")
    chosen = placer.choose(request)
    assert (chosen.address, request.fallbacks) == ("10.0.0.3:8000", ("10.0.0.2:8000",))


def test_placing_a_request_again_ranks_its_fallbacks_again():
    placer = scheduler_for(queue_profile("max-score-picker", 2), *POOL)
    request = InferenceRequest("m", "m")
    request.fallbacks = ("10.0.0.9:8000",)
    placer.choose(request)
    assert request.fallbacks == ("10.0.0.3:8000",)


def test_max_score_ranks_highest_first():
    assert MaxScorePicker(random.Random(1)).rank([0.2, 0.9, 0.5]) == [1, 2, 0]


def test_weighted_random_ranks_zero_scores_last():
    order = WeightedRandomPicker(random.Random(1)).rank([0.0, 0.3, 0.0, 0.7])
    assert set(order[:2]) == {1, 3} and set(order[2:]) == {0, 2}


def test_random_ranks_every_candidate_once():
    assert sorted(RandomPicker(random.Random(1)).rank([1.0] * 5)) == [0, 1, 2, 3, 4]
