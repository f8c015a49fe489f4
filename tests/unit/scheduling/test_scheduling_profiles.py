"""Profiles and profile handlers, configured as the reference's sample
configurations configure them (through the loader and the registry)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from epp.config.loader import parse_config
from epp.flowcontrol.outcome import Outcome
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.filters import ROLE_LABEL
from epp.scheduling.profiles import DATA_PARALLEL_HEADER, ENCODERS_HEADER, PREFILLER_HEADER
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler

NOW = 100.0
HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 40


def pod(index: int, role: str | None = None, waiting: float = 0, **labels: str) -> Endpoint:
    if role is not None:
        labels[ROLE_LABEL] = role
    metrics = EndpointMetrics(waiting=waiting, updated_at=NOW)
    return Endpoint(f"pod-{index}", f"10.0.0.{index}:8000", labels, metrics)


def scheduler_for(document: dict[str, Any], *pods: Endpoint, gate=None) -> Scheduler:
    config = parse_config({**HEAD, **document}).scheduling
    pool = PoolSnapshot(endpoints=pods, version=1, membership=1)
    return Scheduler(config, lambda: pool, lambda: NOW, random.Random(7), gate)


def request(prompt: str = LONG_PROMPT, multimodal: bool = False) -> InferenceRequest:
    return InferenceRequest(
        "m", "m", prompt=prompt, input_tokens=len(prompt) // 4, multimodal=multimodal
    )


PD = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "queue-scorer"},
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "max-score-picker"},
        {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "pd"}}},
        {"type": "prefix-based-pd-decider", "name": "pd", "parameters": {"nonCachedTokens": 16}},
    ],
    "schedulingProfiles": [
        {
            "name": "prefill",
            "plugins": [
                {"pluginRef": "prefill-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer"},
            ],
        },
        {
            "name": "decode",
            "plugins": [
                {"pluginRef": "decode-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer"},
            ],
        },
    ],
}


def test_single_profile_decode_filter_keeps_decode_pods_and_unlabelled_ones() -> None:
    document = {
        "plugins": [{"type": "decode-filter"}, {"type": "queue-scorer"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}],
            }
        ],
    }
    placer = scheduler_for(document, pod(1, "prefill"), pod(2, "decode", waiting=3), pod(3))
    chosen = {placer.choose(request(f"{n}" * 80)).address for n in range(20)}
    assert chosen <= {"10.0.0.2:8000", "10.0.0.3:8000"}
    assert "10.0.0.3:8000" in chosen


def test_a_filter_that_keeps_no_pod_ends_the_request_as_filtered() -> None:
    document = {
        "plugins": [{"type": "prefill-filter"}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "prefill-filter"}]}],
    }
    placer = scheduler_for(document, pod(1, "decode"), pod(2))
    assert placer.choose(request()) is Outcome.REJECTED_FILTERED


def test_a_filter_does_not_fall_back_to_pods_it_excludes_when_its_pods_are_saturated() -> None:
    document = {
        "plugins": [{"type": "decode-filter"}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "decode-filter"}]}],
    }
    placer = scheduler_for(document, pod(1, "prefill"), pod(2, "decode", waiting=50))
    assert placer.choose(request()).address == "10.0.0.2:8000"


def test_disagg_sends_a_long_uncached_prompt_to_a_prefill_pod_in_the_header() -> None:
    placer = scheduler_for(PD, pod(1, "prefill"), pod(2, "decode"))
    wanted = request()
    chosen = placer.choose(wanted)
    assert chosen.address == "10.0.0.2:8000"
    assert wanted.routing == {PREFILLER_HEADER: "10.0.0.1:8000"}


def test_disagg_keeps_a_cached_prompt_on_the_decode_pod() -> None:
    placer = scheduler_for(PD, pod(1, "prefill"), pod(2, "decode"))
    placer.choose(request())
    again = request()
    assert placer.choose(again).address == "10.0.0.2:8000"
    assert again.routing is None


def test_disagg_keeps_a_short_prompt_on_the_decode_pod() -> None:
    placer = scheduler_for(PD, pod(1, "prefill"), pod(2, "decode"))
    short = request("hello there")
    assert placer.choose(short).address == "10.0.0.2:8000"
    assert short.routing is None


def test_disagg_without_prefill_pods_decodes_alone() -> None:
    placer = scheduler_for(PD, pod(2, "decode"), pod(3, "decode"))
    wanted = request()
    assert placer.choose(wanted).address in {"10.0.0.2:8000", "10.0.0.3:8000"}
    assert wanted.routing is None


def test_encode_decider_sends_multimodal_requests_to_an_encoder() -> None:
    document = {
        "plugins": [
            {"type": "encode-filter"},
            {"type": "decode-filter"},
            {"type": "always-disagg-multimodal-decider"},
            {
                "type": "disagg-profile-handler",
                "parameters": {"deciders": {"encode": "always-disagg-multimodal-decider"}},
            },
        ],
        "schedulingProfiles": [
            {"name": "encode", "plugins": [{"pluginRef": "encode-filter"}]},
            {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}]},
        ],
    }
    placer = scheduler_for(document, pod(1, "encode"), pod(2, "prefill-decode"))
    image = request(multimodal=True)
    assert placer.choose(image).address == "10.0.0.2:8000"
    assert image.routing == {ENCODERS_HEADER: "10.0.0.1:8000"}
    text = request()
    placer.choose(text)
    assert text.routing is None


def test_always_disagg_pd_decider_always_prefills_elsewhere() -> None:
    document = {
        **PD,
        "plugins": [
            *PD["plugins"][:5],
            {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "always"}}},
            {"type": "always-disagg-pd-decider", "name": "always"},
        ],
    }
    placer = scheduler_for(document, pod(1, "prefill"), pod(2, "decode"))
    short = request("hi")
    placer.choose(short)
    assert short.routing == {PREFILLER_HEADER: "10.0.0.1:8000"}


def test_data_parallel_routes_to_the_primary_port_and_names_the_rank() -> None:
    document = {
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "data-parallel-profile-handler", "parameters": {"primaryPort": 8000}},
        ],
    }
    rank = Endpoint("pod-1-rank1", "10.0.0.1:8001", {}, EndpointMetrics(updated_at=NOW))
    placer = scheduler_for(document, rank)
    wanted = request()
    assert placer.choose(wanted) is rank
    assert wanted.destination == "10.0.0.1:8000"
    assert wanted.routing == {DATA_PARALLEL_HEADER: "10.0.0.1:8001"}


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (
            {"schedulingProfiles": [{"name": "a"}, {"name": "b"}]},
            "plugins: several scheduling profiles need a profile handler",
        ),
        (
            {
                "plugins": [{"type": "single-profile-handler"}],
                "schedulingProfiles": [{"name": "a"}, {"name": "b"}],
            },
            "plugins[0].type: single-profile-handler runs exactly one profile, got 2",
        ),
        (
            {
                "plugins": [{"type": "disagg-profile-handler"}],
                "schedulingProfiles": [{"name": "prefill"}],
            },
            "plugins[0].parameters.profiles.decode: no scheduling profile named 'decode'",
        ),
        (
            {
                "plugins": [
                    {
                        "type": "disagg-profile-handler",
                        "parameters": {"deciders": {"prefill": "x"}},
                    },
                    {"type": "queue-scorer", "name": "x"},
                ],
                "schedulingProfiles": [{"name": "decode"}],
            },
            "plugins[0].parameters.deciders.prefill: 'x' is a queue-scorer, not a decider",
        ),
        (
            {
                "plugins": [
                    {"type": "single-profile-handler"},
                    {"type": "data-parallel-profile-handler"},
                ]
            },
            "plugins: only one profile handler is allowed",
        ),
    ],
)
def test_handler_rules_of_the_reference(document: dict[str, Any], error: str) -> None:
    from epp.config.loader import ConfigError

    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, **document})
    assert any(found.startswith(error) for found in raised.value.errors), raised.value.errors


def test_without_profiles_one_default_profile_holds_every_declared_filter_scorer_and_picker() -> (
    None
):
    config = parse_config(
        {
            **HEAD,
            "plugins": [
                {"type": "decode-filter"},
                {"type": "queue-scorer"},
                {"type": "random-picker"},
                {"type": "single-profile-handler"},
            ],
        }
    ).scheduling
    (profile,) = config.profiles
    assert profile.name == "default"
    assert [f.name for f in profile.filters] == ["decode-filter"]
    assert [(s.name, s.weight) for s in profile.scorers] == [("queue-scorer", 1.0)]
    assert profile.picker.name == "random-picker"


def test_a_profile_without_a_picker_gets_max_score() -> None:
    config = parse_config(
        {
            **HEAD,
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}],
        }
    ).scheduling
    assert config.profiles[0].picker.name == "max-score-picker"


HEADER_PROFILES = {
    "plugins": [
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "header-profile-handler"},
    ],
    "schedulingProfiles": [
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}]},
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}]},
    ],
}


def test_header_profile_handler_runs_the_profile_the_header_names() -> None:
    prefill, decode = pod(1, "prefill"), pod(2, "decode")
    placer = scheduler_for(HEADER_PROFILES, prefill, decode)
    asked = InferenceRequest("m", "m", headers={"epp-profile": " prefill "})
    assert placer.choose(asked) is prefill
    assert asked.routing is None


def test_header_profile_handler_without_the_header_runs_the_default_profile() -> None:
    prefill, decode = pod(1, "prefill"), pod(2, "decode")
    assert scheduler_for(HEADER_PROFILES, prefill, decode).choose(request()) is decode
    document = {**HEADER_PROFILES, "plugins": [*HEADER_PROFILES["plugins"][:2]]}
    document["plugins"].append(
        {
            "type": "header-profile-handler",
            "parameters": {"headerName": "X-Stage", "defaultProfile": "prefill"},
        }
    )
    placer = scheduler_for(document, prefill, decode)
    assert placer.choose(request()) is prefill
    assert placer.choose(InferenceRequest("m", "m", headers={"x-stage": "decode"})) is decode


def test_header_profile_handler_naming_no_profile_finds_no_endpoint() -> None:
    placer = scheduler_for(HEADER_PROFILES, pod(1, "prefill"), pod(2, "decode"))
    asked = InferenceRequest("m", "m", headers={"epp-profile": "encode"})
    assert placer.choose(asked) is Outcome.REJECTED_NO_ENDPOINTS


def test_header_profile_handler_with_one_profile_always_runs_it() -> None:
    document = {"plugins": [{"type": "queue-scorer"}, {"type": "header-profile-handler"}]}
    only = pod(1)
    asked = InferenceRequest("m", "m", headers={"epp-profile": "nonsense"})
    assert scheduler_for(document, only).choose(asked) is only


def test_header_profile_handler_warns_when_its_default_is_no_profile() -> None:
    document = {**HEADER_PROFILES, "plugins": [*HEADER_PROFILES["plugins"][:2]]}
    document["plugins"].append(
        {"type": "header-profile-handler", "parameters": {"defaultProfile": "encode"}}
    )
    warnings = parse_config({**HEAD, **document}).warnings
    assert any(
        line.startswith("plugins[2].parameters.defaultProfile: no scheduling profile named")
        for line in warnings
    ), warnings


LEGACY_PD = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 16}},
        {"type": "pd-profile-handler"},
    ],
    "schedulingProfiles": [
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}]},
        {
            "name": "decode",
            "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "prefix-cache-scorer"}],
        },
    ],
}


def test_pd_profile_handler_is_the_disagg_handler_with_its_decider_and_a_warning() -> None:
    config = parse_config({**HEAD, **LEGACY_PD})
    assert "plugins[4].type: 'pd-profile-handler' is deprecated; use 'disagg-profile-handler'" in (
        config.warnings
    )
    placer = scheduler_for(LEGACY_PD, pod(1, "prefill"), pod(2, "decode"))
    long = request()
    assert placer.choose(long).name == "pod-2"
    assert long.routing == {PREFILLER_HEADER: "10.0.0.1:8000"}
    again = request()
    assert placer.choose(again).name == "pod-2"
    assert again.routing is None


def test_pd_profile_handler_primary_port_sends_decode_to_the_pods_primary_port() -> None:
    document = {**LEGACY_PD, "plugins": [*LEGACY_PD["plugins"][:4]]}
    document["plugins"].append({"type": "pd-profile-handler", "parameters": {"primaryPort": 9000}})
    rank = Endpoint(
        "pod-2", "10.0.0.2:8001", {ROLE_LABEL: "decode"}, EndpointMetrics(updated_at=NOW)
    )
    placer = scheduler_for(document, pod(1, "prefill"), rank)
    long = request()
    assert placer.choose(long) is rank
    assert long.destination == "10.0.0.2:9000"
    assert long.routing == {
        PREFILLER_HEADER: "10.0.0.1:8000",
        DATA_PARALLEL_HEADER: "10.0.0.2:8001",
    }


def test_pd_profile_handler_needs_its_decider_declared() -> None:
    from epp.config.loader import ConfigError

    document = {
        **LEGACY_PD,
        "plugins": [p for p in LEGACY_PD["plugins"] if "decider" not in p["type"]],
    }
    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, **document})
    assert (
        "plugins[3].parameters.deciderPluginName: no plugin named 'prefix-based-pd-decider' "
        "in plugins" in raised.value.errors
    )


@pytest.mark.parametrize("legacy", ["disagg-headers-handler", "prefill-header-handler"])
def test_a_headers_handler_is_accepted_with_a_warning_naming_its_replacement(legacy: str) -> None:
    document = {**PD, "plugins": [*PD["plugins"], {"type": legacy}]}
    config = parse_config({**HEAD, **document})
    assert f"plugins[7].type: {legacy!r} is deprecated; use 'disagg-profile-handler'" in (
        config.warnings
    )
    placer = scheduler_for(document, pod(1, "prefill"), pod(2, "decode"))
    long = request()
    placer.choose(long)
    assert long.routing == {PREFILLER_HEADER: "10.0.0.1:8000"}


def test_a_headers_handler_naming_other_profiles_than_the_handler_is_refused() -> None:
    from epp.config.loader import ConfigError

    legacy = {"type": "disagg-headers-handler", "parameters": {"prefillProfile": "pf"}}
    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, **PD, "plugins": [*PD["plugins"], legacy]})
    assert raised.value.errors == [
        "plugins[7].parameters.prefillProfile: 'pf' is not the profile handler's prefill "
        "profile 'prefill'; epp writes the headers from the profile handler's profiles"
    ]
