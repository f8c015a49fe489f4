"""The reference's plugins that read what the EPP has in flight or cached:
`token-load-scorer`, `utilization-filter`, `prefix-cache-affinity-filter`
(their READMEs under `pkg/epp/framework/plugins/scheduling/`), and the
in-flight load they read."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from epp.config.fieldreader import FieldReader
from epp.config.loader import ConfigError, parse_config
from epp.config.plugin import read_parameters
from epp.config.registry import REGISTRY
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.cache_scorers import PrefixCacheScorer
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.core import Core, build_core
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.request import InferenceRequest, PrefixMatch
from epp.scheduling.spec import BuildContext

HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
PROMPT = "The quick brown fox jumps over the lazy dog. " * 40
NOW = 100.0


def pod(index: int, **metrics: float) -> Endpoint:
    return Endpoint(
        f"p{index}", f"10.0.0.{index}:8000", {}, EndpointMetrics(updated_at=NOW, **metrics)
    )


def request(prompt: str = PROMPT, tokens: int | None = None) -> InferenceRequest:
    return InferenceRequest(
        "m", "m", prompt=prompt, input_tokens=len(prompt) // 4 if tokens is None else tokens
    )


def context() -> BuildContext:
    return BuildContext(SchedulingConfig(), random.Random(1))


def built(plugin_type: str, where: BuildContext, **parameters):
    """The plugin as a configuration with `parameters` builds it in `where`."""
    entry = REGISTRY.get(plugin_type)
    reader = FieldReader()
    checked = read_parameters(reader, entry.parameters, parameters or None, "p")
    assert reader.errors == []
    return where.build(replace(entry.build(checked), name=plugin_type))


def in_flight(load: InFlightLoad, endpoint: Endpoint, tokens: int) -> FlowRequest:
    """A request of `tokens` prompt tokens dispatched to `endpoint`."""
    flow_request = FlowRequest(f"r{id(load)}{tokens}", "f", 0, 0.0, input_tokens=tokens)
    flow_request.endpoint = endpoint.address
    load.on_dispatch(flow_request)
    return flow_request


def refusal(document: dict) -> str:
    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, **document})
    return str(raised.value)


# -- the in-flight load ----------------------------------------------------------


def test_in_flight_load_counts_requests_and_tokens_per_endpoint_until_they_end():
    load = InFlightLoad()
    first = in_flight(load, pod(1), 100)
    in_flight(load, pod(1), 50)
    load.on_complete(first)
    assert (load.requests_at("10.0.0.1:8000"), load.tokens_at("10.0.0.1:8000")) == (1, 50)


def test_in_flight_tokens_leave_at_the_first_token_and_the_request_at_its_end():
    load = InFlightLoad()
    streamed = in_flight(load, pod(1), 100)
    in_flight(load, pod(1), 50)
    load.on_first_token(streamed)
    assert (load.requests_at("10.0.0.1:8000"), load.tokens_at("10.0.0.1:8000")) == (2, 50)
    load.on_complete(streamed)
    assert (load.requests_at("10.0.0.1:8000"), load.tokens_at("10.0.0.1:8000")) == (1, 50)


def test_in_flight_load_charges_only_the_prompt_not_cached_where_it_was_placed():
    load = InFlightLoad()
    payload = request(tokens=100)
    payload.prefix_match = PrefixMatch("p", "approx-prefix-cache-producer", 3, 6, 16, 100)
    flow_request = FlowRequest("r", "f", 0, 0.0, input_tokens=100, payload=payload)
    flow_request.endpoint = pod(1).address
    load.on_dispatch(flow_request)
    assert load.tokens_at("10.0.0.1:8000") == 100 - 3 * 16


def test_in_flight_load_gives_back_what_it_charged_even_if_the_estimate_changed():
    load = InFlightLoad()
    charged = in_flight(load, pod(1), 100)
    charged.input_tokens = 7  # a completion corrects the estimate
    load.on_complete(charged)
    assert load.tokens_at("10.0.0.1:8000") == 0


def token_load_core() -> Core:
    """The core of a one-pod pool whose profile has a token-load-scorer."""
    config = parse_config(
        {
            **HEAD,
            "plugins": [{"type": "token-load-scorer"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "token-load-scorer"}]}],
        }
    ).scheduling
    pool = PoolSnapshot(endpoints=(pod(1),), version=1, membership=1)
    core = build_core(FlowControlConfig(), config, lambda: pool, lambda: NOW, random.Random(1))
    return core


def test_the_core_tells_the_in_flight_load_of_dispatches_when_a_plugin_reads_it():
    core = token_load_core()
    flow_request = FlowRequest("r", "f", 0, NOW, input_tokens=40, payload=request())
    core.controller.enqueue_and_dispatch(flow_request, NOW)
    assert core.load is not None and core.load.tokens_at("10.0.0.1:8000") == 40


def test_the_core_takes_a_requests_tokens_off_its_endpoint_at_its_first_token():
    core = token_load_core()
    flow_request = FlowRequest("r", "f", 0, NOW, input_tokens=40, payload=request())
    core.controller.enqueue_and_dispatch(flow_request, NOW)
    core.first_token(flow_request, NOW + 0.1)
    assert core.load is not None
    assert (core.load.requests_at("10.0.0.1:8000"), core.load.tokens_at("10.0.0.1:8000")) == (1, 0)


def test_the_core_has_no_in_flight_load_when_no_plugin_reads_it():
    pool = PoolSnapshot(endpoints=(pod(1),), version=1, membership=1)
    core = build_core(
        FlowControlConfig(), SchedulingConfig(), lambda: pool, lambda: NOW, random.Random(1)
    )
    assert core.load is None


# -- token-load-scorer -----------------------------------------------------------


def test_token_load_scores_one_minus_the_share_of_the_threshold_in_flight():
    where = context()
    scorer = built("token-load-scorer", where, queueThresholdTokens=1000)
    in_flight(where.load, pod(2), 500)
    in_flight(where.load, pod(3), 4000)
    scores = scorer.score(request(tokens=0), [pod(1), pod(2), pod(3)])
    assert scores == [1.0, 0.5, 0.0]


def test_token_load_counts_the_requests_own_prompt():
    where = context()
    scorer = built("token-load-scorer", where, queueThresholdTokens=1000)
    assert scorer.score(request(tokens=250), [pod(1)]) == [0.75]


def test_token_load_does_not_count_the_prompt_cached_on_the_endpoint():
    where = context()
    prefix = built("prefix-cache-scorer", where)
    scorer = built("token-load-scorer", where, queueThresholdTokens=1000)
    prefix.picked(request(), pod(1))
    cached, cold = scorer.score(request(), [pod(1), pod(2)])
    assert cached > cold == 1.0 - (len(PROMPT) // 4) / 1000


def test_token_load_threshold_defaults_to_4mi_tokens_and_non_positive_means_default():
    assert built("token-load-scorer", context()).threshold == 4_194_304
    assert built("token-load-scorer", context(), queueThresholdTokens=0).threshold == 4_194_304


# -- utilization-filter ------------------------------------------------------------


def test_utilization_filter_drops_a_pod_over_any_cap():
    keep = built(
        "utilization-filter",
        context(),
        conditions=[
            {"metric": "running-requests", "maxValue": 40},
            {"metric": "waiting-queue", "maxValue": 0},
        ],
    )
    pods = [pod(1, running=40), pod(2, running=41), pod(3, running=1, waiting=1)]
    assert [p.name for p in keep.filter(request(), pods)] == ["p1"]


def test_utilization_filter_caps_kv_cache_usage():
    keep = built(
        "utilization-filter",
        context(),
        conditions=[{"metric": "kv-cache-utilization", "maxValue": 0.8}],
    )
    pods = [pod(1, kv_usage=0.8), pod(2, kv_usage=0.9)]
    assert [p.name for p in keep.filter(request(), pods)] == ["p1"]


def test_utilization_filter_caps_the_requests_this_epp_has_in_flight():
    where = context()
    keep = built(
        "utilization-filter", where, conditions=[{"metric": "active-requests", "maxValue": 1}]
    )
    in_flight(where.load, pod(2), 1)
    in_flight(where.load, pod(2), 2)
    assert [p.name for p in keep.filter(request(), [pod(1), pod(2)])] == ["p1"]


def test_utilization_filter_keeps_none_when_all_are_over_without_fallback():
    keep = built(
        "utilization-filter", context(), conditions=[{"metric": "waiting-queue", "maxValue": 0}]
    )
    assert keep.filter(request(), [pod(1, waiting=3)]) == []


def test_utilization_filter_falls_back_to_all_when_asked():
    keep = built(
        "utilization-filter",
        context(),
        conditions=[{"metric": "waiting-queue", "maxValue": 0}],
        fallbackOnEmpty=True,
    )
    pods = [pod(1, waiting=3), pod(2, waiting=4)]
    assert keep.filter(request(), pods) == pods


def test_utilization_filter_needs_a_condition():
    document = {"plugins": [{"type": "utilization-filter", "parameters": {"conditions": []}}]}
    assert "at least one condition" in refusal(document)


def test_utilization_filter_refuses_a_kv_cap_above_one():
    parameters = {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 80}]}
    document = {"plugins": [{"type": "utilization-filter", "parameters": parameters}]}
    assert "conditions[0].maxValue" in refusal(document)


# -- prefix-cache-affinity-filter --------------------------------------------------


def affinity(where: BuildContext, **parameters):
    return built("prefix-cache-affinity-filter", where, **parameters)


def sticky_to_pod_2(**parameters):
    """(the plugins' context, an affinity filter) once the prefix scorer saw
    the prompt picked for pod 2."""
    where = context()
    prefix = built("prefix-cache-scorer", where)
    keep = affinity(where, **parameters)
    prefix.picked(request(), pod(2))
    return where, keep


def test_affinity_keeps_only_the_pods_holding_the_prompt():
    _, keep = sticky_to_pod_2()
    assert [p.name for p in keep.filter(request(), [pod(1), pod(2), pod(3)])] == ["p2"]


def test_affinity_keeps_all_pods_when_none_holds_enough_of_the_prompt():
    where = context()
    prefix = built("prefix-cache-scorer", where)
    keep = affinity(where, affinityThreshold=0.99)
    prefix.picked(request(PROMPT[: len(PROMPT) // 2]), pod(2))
    pods = [pod(1), pod(2)]
    assert keep.filter(request(), pods) == pods


def test_affinity_breaks_stickiness_when_the_sticky_pods_are_too_loaded():
    where, keep = sticky_to_pod_2(maxTTFTPenaltyMs=1000, peakPrefillThroughput=1000)
    in_flight(where.load, pod(2), 1001)  # 1001 ms of prefill ahead of it
    pods = [pod(1), pod(2)]
    assert keep.filter(request(), pods) == pods


def test_affinity_sticks_while_the_penalty_is_within_the_limit():
    where, keep = sticky_to_pod_2(maxTTFTPenaltyMs=1000, peakPrefillThroughput=1000)
    in_flight(where.load, pod(2), 1000)
    assert [p.name for p in keep.filter(request(), [pod(1), pod(2)])] == ["p2"]


def test_affinity_with_a_zero_penalty_always_sticks():
    where, keep = sticky_to_pod_2(maxTTFTPenaltyMs=0)
    in_flight(where.load, pod(2), 10**9)
    assert [p.name for p in keep.filter(request(), [pod(1), pod(2)])] == ["p2"]


def test_affinity_explores_all_pods_with_its_probability():
    _, keep = sticky_to_pod_2(explorationProbability=1.0)
    pods = [pod(1), pod(2)]
    assert keep.filter(request(), pods) == pods


def test_affinity_without_a_prefix_scorer_keeps_its_own_index_and_learns_picks():
    where = context()
    keep = affinity(where)
    keep.picked(request(), pod(2))
    assert [p.name for p in keep.filter(request(), [pod(1), pod(2)])] == ["p2"]


def test_a_prefix_scorer_built_after_the_affinity_filter_shares_its_index():
    where = context()
    keep = affinity(where)
    keep.picked(request(), pod(2))
    prefix = built("prefix-cache-scorer", where)
    assert isinstance(prefix, PrefixCacheScorer)
    assert prefix.matched_blocks(request(), "10.0.0.2:8000") > 0


def test_affinity_refuses_the_latency_predictor_as_ttft_source():
    parameters = {"ttftSource": "latencyPredictor"}
    document = {"plugins": [{"type": "prefix-cache-affinity-filter", "parameters": parameters}]}
    assert "is not supported by epp" in refusal(document)


def test_affinity_needs_a_prefill_throughput_to_estimate_the_penalty():
    parameters = {"peakPrefillThroughput": 0}
    document = {"plugins": [{"type": "prefix-cache-affinity-filter", "parameters": parameters}]}
    assert "peakPrefillThroughput" in refusal(document)
