"""The reference's scheduling plugins, each with its README's behaviour:
scores, filtering, parameters and defaults."""

from __future__ import annotations

import random

import pytest

from epp.config.fieldreader import FieldReader
from epp.config.plugin import read_parameters
from epp.config.registry import REGISTRY
from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.cache_scorers import NoHitLruScorer, PrefixCacheScorer
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.endpoint import Endpoint, EndpointMetrics
from epp.scheduling.filters import ROLE_LABEL
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import (
    ActiveRequestScorer,
    ContextLengthAwareScorer,
    LoadAwareScorer,
)
from epp.scheduling.spec import BuildContext

REQUEST = InferenceRequest("m", "m")


def pod(index: int, labels: dict[str, str] | None = None, **metrics: float) -> Endpoint:
    return Endpoint(f"p{index}", f"10.0.0.{index}:8000", labels or {}, EndpointMetrics(**metrics))


def built(plugin_type: str, gate=None, **parameters):
    """The plugin as a configuration with `parameters` builds it."""
    entry = REGISTRY.get(plugin_type)
    reader = FieldReader()
    checked = read_parameters(reader, entry.parameters, parameters or None, "p")
    assert reader.errors == []
    spec = entry.build(checked)
    context = BuildContext(SchedulingConfig(), random.Random(1), gate)
    return context.build(spec)


@pytest.mark.parametrize(
    ("role", "decode", "prefill", "encode"),
    [
        (None, True, False, False),
        ("decode", True, False, False),
        ("prefill", False, True, False),
        ("encode", False, False, True),
        ("prefill-decode", True, True, False),
        ("encode-prefill", False, True, True),
        ("encode-prefill-decode", True, True, True),
        ("both", True, True, False),
        ("something-else", False, False, False),
    ],
)
def test_role_filters_follow_the_role_label(role, decode, prefill, encode) -> None:
    endpoint = pod(1, {ROLE_LABEL: role} if role else {})
    for plugin_type, kept in (
        ("decode-filter", decode),
        ("prefill-filter", prefill),
        ("encode-filter", encode),
    ):
        assert (built(plugin_type).filter(REQUEST, [endpoint]) == [endpoint]) is kept, plugin_type


def test_label_selector_filter_matches_labels_and_expressions() -> None:
    keep = built(
        "label-selector-filter",
        matchLabels={"tier": "gold"},
        matchExpressions=[
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "draining", "operator": "DoesNotExist"},
        ],
    )
    pods = [
        pod(1, {"tier": "gold", "zone": "a"}),
        pod(2, {"tier": "gold", "zone": "c"}),
        pod(3, {"tier": "gold", "zone": "b", "draining": "1"}),
        pod(4, {"tier": "silver", "zone": "a"}),
    ]
    assert [p.name for p in keep.filter(REQUEST, pods)] == ["p1"]


def test_load_aware_scores_half_when_idle_and_falls_to_zero_at_the_threshold() -> None:
    scorer = built("load-aware-scorer", threshold=10)
    assert isinstance(scorer, LoadAwareScorer)
    pods = [pod(1, waiting=0), pod(2, waiting=5), pod(3, waiting=10), pod(4, waiting=50)]
    assert scorer.score(REQUEST, pods) == [0.5, 0.25, 0.0, 0.0]


def test_load_aware_default_threshold_is_128_and_non_positive_means_default() -> None:
    assert built("load-aware-scorer").threshold == 128
    assert built("load-aware-scorer", threshold=0).threshold == 128


def test_active_request_scores_idle_pods_one_and_busy_ones_by_their_count() -> None:
    gate = ConcurrencyGate()
    for endpoint, count in (("10.0.0.2:8000", 2), ("10.0.0.3:8000", 4)):
        for n in range(count):
            request = FlowRequest(f"{endpoint}{n}", "f", 0, 0.0)
            request.endpoint = endpoint
            gate.on_dispatch(request)
    scorer = built("active-request-scorer", gate=gate, maxBusyScore=0.8)
    assert isinstance(scorer, ActiveRequestScorer)
    assert scorer.score(REQUEST, [pod(1), pod(2), pod(3)]) == [1.0, pytest.approx(0.4), 0.0]
    idle = built("active-request-scorer", gate=gate, idleThreshold=2)
    assert idle.score(REQUEST, [pod(1), pod(2), pod(3)]) == [1.0, 1.0, 0.0]


def test_context_length_prefers_the_narrowest_range_that_fits() -> None:
    scorer = built("context-length-aware")
    assert isinstance(scorer, ContextLengthAwareScorer)
    request = InferenceRequest("m", "m", input_tokens=1000)
    label = "llm-d.ai/context-length-range"
    pods = [
        pod(1, {label: "0-2048"}),
        pod(2, {label: "0-32768"}),
        pod(3, {label: "4096-8192"}),
        pod(4),
        pod(5, {label: "bad"}),
    ]
    scores = scorer.score(request, pods)
    assert scores[0] > scores[1] > scores[2]
    assert scores[3] == 0.5 and scores[4] == 0.0
    assert scores[2] == pytest.approx(0.3 / (1 + 3096 / 1000))


def test_context_length_filters_only_when_enabled() -> None:
    label = "llm-d.ai/context-length-range"
    pods = [pod(1, {label: "0-512"}), pod(2, {label: "0-4096"}), pod(3)]
    request = InferenceRequest("m", "m", input_tokens=1000)
    assert built("context-length-aware").filter(request, pods) == pods
    kept = built("context-length-aware", enableFiltering=True).filter(request, pods)
    assert [p.name for p in kept] == ["p2", "p3"]


def test_no_hit_lru_spreads_cold_requests_over_the_least_recently_used() -> None:
    prefix = PrefixCacheScorer(64, 256, 1000)
    scorer = NoHitLruScorer(prefix, size=8)
    pods = [pod(1), pod(2), pod(3)]
    cold = InferenceRequest("m", "m", prompt="x" * 10)
    assert scorer.score(cold, pods) == [1.0, 0.5, 0.0]
    scorer.picked(cold, pods[0])
    assert scorer.score(cold, pods) == [0.0, 1.0, 0.5]
    scorer.picked(cold, pods[1])
    assert scorer.score(cold, pods) == [0.5, 0.0, 1.0]


def test_no_hit_lru_is_neutral_on_a_warm_request() -> None:
    prefix = PrefixCacheScorer(64, 256, 1000)
    warm = InferenceRequest("m", "m", prompt="y" * 640)
    prefix.picked(warm, pod(1))
    scorer = NoHitLruScorer(prefix)
    assert scorer.score(warm, [pod(1), pod(2)]) == [0.5, 0.5]


def test_prefix_match_length_weight_adds_the_squared_match_length() -> None:
    scorer = PrefixCacheScorer(64, 256, 1000, match_length_weight=0.5, match_length_scale_tokens=64)
    prompt = "z" * 640
    request = InferenceRequest("m", "m", prompt=prompt)
    scorer.picked(request, pod(1))
    half = InferenceRequest("m", "m", prompt=prompt[:320] + "w" * 320)
    # 5 of 10 blocks matched: ratio 0.5; 5 x 16 tokens = 80 > 64 scale: length term 1.
    assert scorer.sparse_scores(half) == {"10.0.0.1:8000": pytest.approx(0.5 * 1 + 0.5 * 0.5)}


def test_a_picker_of_several_endpoints_warns_that_original_dst_takes_one() -> None:
    from epp.config.loader import parse_config

    config = parse_config(
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [{"type": "random-picker", "parameters": {"maxNumOfEndpoints": 2}}],
        }
    )
    assert any("maxNumOfEndpoints" in warning for warning in config.warnings)


def test_header_label_affinity_scores_pods_whose_label_equals_the_header() -> None:
    scorer = built("header-label-affinity-scorer", headerName="X-Preferred-Zone", labelKey="zone")
    pods = [pod(1, {"zone": "a"}), pod(2, {"zone": "b"}), pod(3)]
    wanted = InferenceRequest("m", "m", headers={"x-preferred-zone": "b"})
    assert scorer.score(wanted, pods) == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("headers", [{}, {"x-preferred-zone": ""}, {"x-preferred-zone": "c"}])
def test_header_label_affinity_without_a_matching_header_scores_every_pod_zero(headers) -> None:
    scorer = built("header-label-affinity-scorer", headerName="x-preferred-zone", labelKey="zone")
    pods = [pod(1, {"zone": "a"}), pod(2, {"zone": "b"})]
    assert scorer.score(InferenceRequest("m", "m", headers=headers), pods) == [0.0, 0.0]


@pytest.mark.parametrize("missing", ["headerName", "labelKey"])
def test_header_label_affinity_needs_both_parameters(missing: str) -> None:
    from epp.config.loader import ConfigError, parse_config

    parameters = {"headerName": "x-zone", "labelKey": "zone", missing: ""}
    with pytest.raises(ConfigError) as raised:
        parse_config(
            {
                "apiVersion": "llm-d.ai/v1alpha1",
                "kind": "EndpointPickerConfig",
                "plugins": [{"type": "header-label-affinity-scorer", "parameters": parameters}],
            }
        )
    assert raised.value.errors == [f"plugins[0].parameters.{missing}: required"]
