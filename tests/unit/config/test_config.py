from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from epp.config.loader import ConfigError, EppConfig, load_config, parse_config
from epp.flowcontrol.config import (
    BandConfig,
    Fairness,
    FlowControlConfig,
    GateKind,
    Ordering,
    ProgramAwareConfig,
)
from epp.scheduling.saturation import SaturationThresholds

ROOT = Path(__file__).parents[3]
HEAD = {"apiVersion": "llm-d.ai/v1", "kind": "EndpointPickerConfig"}


def config(**fields: Any) -> dict[str, Any]:
    return {**HEAD, **fields}


def errors_of(document: Any) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config(document)
    return raised.value.errors


def test_default_file_is_the_defaults() -> None:
    assert load_config(ROOT / "config" / "epp" / "default.yaml") == EppConfig()


def test_empty_document_is_the_defaults_but_for_the_references_fairness_and_gate() -> None:
    parsed = parse_config(config())
    assert parsed.flow_control.default_band.fairness is Fairness.GLOBAL_STRICT
    assert EppConfig().flow_control.default_band.fairness is Fairness.VTC
    assert not parsed.feature_gates["flowControl"] and EppConfig().feature_gates["flowControl"]
    defaults = EppConfig()
    assert (
        replace(parsed, flow_control=defaults.flow_control, feature_gates=defaults.feature_gates)
        == defaults
    )


def test_flow_control_fields_are_read() -> None:
    parsed = parse_config(
        config(
            flowControl={
                "maxRequests": 100,
                "maxBytes": "10Mi",
                "defaultRequestTTL": "30s",
                "flowIdleTimeout": "1m",
                "defaultPriorityBand": {
                    "maxRequests": 50,
                    "ttl": "10s",
                    "orderingPolicyRef": "edf",
                },
                "priorityBands": [
                    {
                        "priority": -5,
                        "maxBytes": 1000,
                        "fairnessPolicyRef": "round-robin-fairness-policy",
                    },
                    {"priority": 10, "ttl": "2s"},
                ],
            }
        )
    ).flow_control
    template = BandConfig(
        priority=0,
        max_requests=50,
        ttl=10.0,
        ordering=Ordering.EDF,
        fairness=Fairness.GLOBAL_STRICT,
    )
    assert parsed == FlowControlConfig(
        max_requests=100,
        max_bytes=10 << 20,
        default_ttl=30.0,
        flow_idle_timeout=60.0,
        default_band=template,
        bands=(
            replace(template, priority=10, ttl=2.0),
            BandConfig(
                priority=-5,
                max_requests=50,
                max_bytes=1000,
                ttl=10.0,
                ordering=Ordering.EDF,
                fairness=Fairness.ROUND_ROBIN,
            ),
        ),
    )


def test_vtc_weights_come_from_the_referenced_plugin() -> None:
    parsed = parse_config(
        config(
            plugins=[
                {
                    "type": "vtc-fairness-policy",
                    "name": "heavy-output",
                    "parameters": {"inputTokenWeight": 1, "outputTokenWeight": 4},
                }
            ],
            flowControl={"priorityBands": [{"priority": 1, "fairnessPolicyRef": "heavy-output"}]},
        )
    )
    band = parsed.flow_control.band(1)
    assert (band.fairness, band.input_weight, band.output_weight) == (Fairness.VTC, 1.0, 4.0)


def test_program_aware_fairness_parameters_reach_the_band() -> None:
    parsed = parse_config(
        config(
            plugins=[
                {
                    "type": "program-aware-fairness",
                    "parameters": {
                        "strategy": "las",
                        "lasWeightService": 0.5,
                        "lasWeightHeadWait": 0.5,
                        "lasHalfLifeSeconds": 30,
                        "evictionTtlSeconds": 600,
                        "evictionSweepSeconds": 60,
                    },
                }
            ],
            flowControl={"defaultPriorityBand": {"fairnessPolicyRef": "program-aware-fairness"}},
        )
    )
    band = parsed.flow_control.default_band
    assert band.fairness is Fairness.PROGRAM_AWARE
    assert band.program_aware == ProgramAwareConfig(0.5, 0.5, 30.0, 600.0, 60.0)


def test_program_aware_fairness_defaults_are_the_references() -> None:
    band = parse_config(
        config(
            plugins=[{"type": "program-aware-fairness"}],
            flowControl={"defaultPriorityBand": {"fairnessPolicyRef": "program-aware-fairness"}},
        )
    ).flow_control.default_band
    assert band.program_aware == ProgramAwareConfig(0.8, 0.2, 60.0, 3600.0, 300.0)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"strategy": "wfq"}, "plugins[0].parameters.strategy: "),
        ({"lasWeightService": -0.1}, "plugins[0].parameters.lasWeightService: must be"),
        ({"lasWeightHeadWait": -1}, "plugins[0].parameters.lasWeightHeadWait: must be"),
        ({"lasHalfLifeSeconds": -1}, "plugins[0].parameters.lasHalfLifeSeconds: must be"),
        ({"evictionTtlSeconds": -1}, "plugins[0].parameters.evictionTtlSeconds: must be"),
        ({"evictionSweepSeconds": 0}, "plugins[0].parameters.evictionSweepSeconds: must be"),
    ],
)
def test_program_aware_fairness_parameters_out_of_range_are_refused_by_name(
    parameters: dict[str, Any], message: str
) -> None:
    errors = errors_of(
        config(plugins=[{"type": "program-aware-fairness", "parameters": parameters}])
    )
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_gate_fields_are_read() -> None:
    gate = parse_config(
        config(
            flowControl={
                "gate": {
                    "kinds": ["concurrency", "utilization"],
                    "maxInFlight": 64,
                    "maxPerEndpoint": 8,
                }
            }
        )
    ).flow_control.gate
    assert gate.kinds == {GateKind.CONCURRENCY, GateKind.UTILIZATION}
    assert (gate.max_in_flight, gate.max_per_endpoint) == (64, 8)


def saturation_filter(**parameters: Any) -> dict[str, Any]:
    return {"type": "saturation-filter", "parameters": parameters}


def test_the_saturation_filters_parameters_are_the_one_set_of_thresholds() -> None:
    filter_plugin = saturation_filter(
        queueDepthThreshold=3, kvCacheUtilThreshold=0.9, metricsStalenessThreshold="1s"
    )
    parsed = parse_config(config(plugins=[filter_plugin]))
    assert parsed.scheduling.saturation == SaturationThresholds(3, 0.9, 1.0)


def test_without_a_saturation_filter_the_thresholds_are_the_defaults() -> None:
    assert parse_config(config()).scheduling.saturation == SaturationThresholds()


def test_a_zero_kv_cache_threshold_is_refused_at_the_filters_parameters() -> None:
    (error,) = errors_of(config(plugins=[saturation_filter(kvCacheUtilThreshold=0)]))
    assert error.startswith("plugins[0].parameters: saturation thresholds must be positive")


def test_a_gate_threshold_saying_what_the_filter_says_is_accepted_with_a_warning() -> None:
    parsed = parse_config(
        config(
            plugins=[saturation_filter(queueDepthThreshold=3)],
            flowControl={"gate": {"queueDepthThreshold": 3, "metricsStalenessThreshold": "200ms"}},
        )
    )
    assert [w.split(":")[0] for w in parsed.warnings if "deprecated" in w] == [
        "flowControl.gate.queueDepthThreshold",
        "flowControl.gate.metricsStalenessThreshold",
    ]


def test_a_gate_threshold_that_differs_from_the_filters_is_refused() -> None:
    errors = errors_of(config(flowControl={"gate": {"kvCacheUtilThreshold": 0.9}}))
    assert errors == [
        "flowControl.gate.kvCacheUtilThreshold: 0.9 differs from saturation-filter's "
        "kvCacheUtilThreshold 0.8: the saturation thresholds are set once, in "
        "saturation-filter's parameters"
    ]


def test_scheduling_profile_sets_scorers_weights_and_picker() -> None:
    scheduling = parse_config(
        config(
            plugins=[
                {"type": "queue-scorer"},
                {"type": "prefix-cache-scorer", "name": "prefix"},
                {
                    "type": "approx-prefix-cache-producer",
                    "parameters": {"blockSizeTokens": 8, "maxPrefixTokensToMatch": 0},
                },
                {"type": "weighted-random-picker"},
            ],
            schedulingProfiles=[
                {
                    "name": "default",
                    "plugins": [
                        {"pluginRef": "queue-scorer"},
                        {"pluginRef": "prefix", "weight": 5},
                        {"pluginRef": "weighted-random-picker"},
                    ],
                }
            ],
        )
    ).scheduling
    (profile,) = scheduling.profiles
    assert [(scorer.name, scorer.weight) for scorer in profile.scorers] == [
        ("queue-scorer", 1.0),
        ("prefix", 5.0),
    ]
    assert profile.picker.name == "weighted-random-picker"
    assert scheduling.prefix_block_chars == 32
    assert scheduling.prefix_max_blocks == 2048


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (config(extra=1), "extra: unknown field"),
        ({"kind": "EndpointPickerConfig"}, "apiVersion: must be 'llm-d.ai/v1'"),
        (config(kind="Other"), "kind: must be 'EndpointPickerConfig'"),
        (config(flowControl={"maxRequest": 1}), "flowControl.maxRequest: unknown field"),
        (config(flowControl={"maxRequests": -1}), "flowControl.maxRequests: must not be negative"),
        (
            config(flowControl={"maxRequests": "many"}),
            "flowControl.maxRequests: must be a byte count or quantity",
        ),
        (config(flowControl={"maxBytes": "1GB"}), "flowControl.maxBytes: must be a byte count"),
        (
            config(flowControl={"defaultRequestTTL": "soon"}),
            "flowControl.defaultRequestTTL: invalid duration",
        ),
        (
            config(flowControl={"defaultRequestTTL": "-1s"}),
            "flowControl.defaultRequestTTL: must be >= 0s, got '-1s'",
        ),
        (config(flowControl={"priorityBands": {}}), "flowControl.priorityBands: must be a list"),
        (
            config(flowControl={"priorityBands": [{"maxRequests": 1}]}),
            "flowControl.priorityBands[0].priority: required",
        ),
        (
            config(flowControl={"priorityBands": [{"priority": 1}, {"priority": 1}]}),
            "flowControl.priorityBands[1].priority: duplicate band for priority 1",
        ),
        (
            config(flowControl={"priorityBands": [{"priority": 1, "ttl": "x"}]}),
            "flowControl.priorityBands[0].ttl: invalid duration",
        ),
        (
            config(flowControl={"defaultPriorityBand": {"fairnessPolicyRef": "fair"}}),
            "flowControl.defaultPriorityBand.fairnessPolicyRef: no plugin named 'fair'",
        ),
        (
            config(flowControl={"defaultPriorityBand": {"orderingPolicyRef": "vtc"}}),
            "flowControl.defaultPriorityBand.orderingPolicyRef: "
            "vtc-fairness-policy is not an ordering policy",
        ),
        (
            config(flowControl={"gate": {"kinds": ["magic"]}}),
            "flowControl.gate.kinds[0]: unknown gate 'magic'",
        ),
        (
            config(
                plugins=[{"type": "saturation-filter", "parameters": {"kvCacheUtilThreshold": 2}}]
            ),
            "plugins[0].parameters.kvCacheUtilThreshold: must be",
        ),
        (config(plugins=[{"type": "nope"}]), "plugins[0].type: unknown plugin type 'nope'"),
        (config(plugins=[{"name": "x"}]), "plugins[0].type: required"),
        (
            config(plugins=[{"type": "queue-scorer"}, {"type": "queue-scorer"}]),
            "plugins[1].name: duplicate plugin name",
        ),
        (
            config(plugins=[{"type": "queue-scorer", "parameters": {"depth": 1}}]),
            "plugins[0].parameters.depth: unknown field",
        ),
        (
            config(
                plugins=[
                    {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 0}}
                ]
            ),
            "plugins[0].parameters.blockSizeTokens: must be >= 1",
        ),
        (
            config(
                plugins=[{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": "2"}}]
            ),
            "plugins[0].parameters.maxNumOfEndpoints: must be an integer",
        ),
        (
            config(plugins=[{"type": "mm-embeddings-cache-producer"}]),
            "plugins[0].type: plugin type 'mm-embeddings-cache-producer' is not supported by epp: ",
        ),
        (
            config(flowControl={"defaultRequestTTL": 60}),
            'flowControl.defaultRequestTTL: must be a duration string such as "60s"',
        ),
        (
            config(schedulingProfiles=[{"name": "d", "plugins": [{"pluginRef": "queue-scorer"}]}]),
            "schedulingProfiles[0].plugins[0].pluginRef: no plugin named 'queue-scorer' in plugins",
        ),
        (
            config(
                plugins=[{"type": "queue-scorer"}],
                schedulingProfiles=[
                    {"name": "d", "plugins": [{"pluginRef": "queue-scorer", "weight": -1}]}
                ],
            ),
            "schedulingProfiles[0].plugins[0].weight: must be >= 0, got -1",
        ),
        (
            config(
                plugins=[{"type": "max-score-picker"}],
                schedulingProfiles=[
                    {"name": "d", "plugins": [{"pluginRef": "max-score-picker", "weight": 2}]}
                ],
            ),
            "schedulingProfiles[0].plugins[0].weight: only scorers take a weight",
        ),
        (
            config(schedulingProfiles=[{"name": "a"}, {"name": "b"}]),
            "plugins: several scheduling profiles need a profile handler",
        ),
        ("just text", "<document>: must be a mapping, got str"),
    ],
)
def test_bad_config_error_names_the_path(document: Any, error: str) -> None:
    assert any(found.startswith(error) or error in found for found in errors_of(document)), (
        errors_of(document)
    )


def test_all_errors_are_reported_together() -> None:
    found = errors_of(config(flowControl={"maxRequests": -1, "maxBytes": "x", "bogus": 1}))
    assert len(found) == 3


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nflowControl: {maxBytes: x}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: flowControl.maxBytes:")


def test_load_config_of_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text("flowControl: [\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)


def test_usage_limit_policies_build_from_the_reference_parameters():
    from epp.config.registry import REGISTRY
    from epp.flowcontrol.usagelimits import Domain, PriorityHoldback, StaticUsageLimit

    holdback = REGISTRY.get("priority-holdback-policy")
    built = holdback.build(
        {"shape": "linear", "domain": "value", "minCeiling": 0.5, "maxCeiling": 1.0}
    )
    assert built == PriorityHoldback(0.5, 1.0, Domain.VALUE)
    assert REGISTRY.get("static-usage-limit-policy").build({"threshold": 0.8}) == StaticUsageLimit(
        0.8
    )


def test_a_holdback_whose_min_ceiling_is_not_below_its_max_is_an_error_naming_it():
    document = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {
                "type": "priority-holdback-policy",
                "parameters": {"minCeiling": 0.9, "maxCeiling": 0.8},
            }
        ],
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    assert caught.value.errors == [
        "plugins[0].parameters.minCeiling: must be strictly less than maxCeiling (0.8), got 0.9"
    ]


def test_the_usage_limit_policy_a_config_names_reaches_the_gate():
    from epp.flowcontrol.usagelimits import StaticUsageLimit

    document = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "static-usage-limit-policy", "name": "flat"}],
        "flowControl": {"usageLimitPolicyPluginRef": "flat"},
    }
    assert parse_config(document).flow_control.gate.usage_limits == StaticUsageLimit(1.0)


def test_without_a_usage_limit_policy_the_gate_holds_back_by_priority():
    from epp.flowcontrol.usagelimits import DEFAULT_USAGE_LIMITS

    assert EppConfig().flow_control.gate.usage_limits == DEFAULT_USAGE_LIMITS


def test_no_endpoint_request_ttl_is_read() -> None:
    parsed = parse_config(config(flowControl={"noEndpointRequestTTL": "5m"})).flow_control
    assert parsed.empty_pool_ttl == 300.0


def test_no_endpoint_request_ttl_follows_the_default_request_ttl_when_unset() -> None:
    parsed = parse_config(config(flowControl={"defaultRequestTTL": "20s"})).flow_control
    assert parsed.empty_pool_ttl == 20.0


def test_a_zero_no_endpoint_request_ttl_stays_zero() -> None:
    parsed = parse_config(
        config(flowControl={"defaultRequestTTL": "20s", "noEndpointRequestTTL": "0s"})
    ).flow_control
    assert parsed.empty_pool_ttl == 0.0


def test_the_prefill_timeout_is_a_gate_field_read_as_a_go_duration() -> None:
    parsed = parse_config(config(flowControl={"gate": {"prefillTimeout": "1m30s"}}))
    assert parsed.flow_control.gate.prefill_timeout == 90.0
    assert parse_config(config()).flow_control.gate.prefill_timeout == 60.0


@pytest.mark.parametrize("value", ["0s", "-1s", "soon"])
def test_a_prefill_timeout_that_is_no_positive_duration_is_refused(value: str) -> None:
    errors = errors_of(config(flowControl={"gate": {"prefillTimeout": value}}))
    assert any("flowControl.gate.prefillTimeout" in error for error in errors)


def test_a_plugin_with_a_bad_parameter_is_reported_once_not_again_where_referenced() -> None:
    document = config(
        plugins=[
            {"type": "saturation-filter", "parameters": {"metricsStalenessThreshold": 0.2}},
            {"type": "queue-scorer"},
        ],
        schedulingProfiles=[
            {
                "name": "d",
                "plugins": [{"pluginRef": "saturation-filter"}, {"pluginRef": "queue-scorer"}],
            }
        ],
    )
    assert errors_of(document) == [
        "plugins[0].parameters.metricsStalenessThreshold: "
        'must be a duration string such as "60s", got 0.2'
    ]
