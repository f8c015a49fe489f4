"""The rest of the EndpointPickerConfig schema: featureGates, both
apiVersions, dataLayer, requestHandler, the flowControl fields and the
deprecated top-level keys, with the reference's defaults."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.datalayer import CoreMetricsSettings, DataLayerConfig, MetricsSourceSettings
from epp.config.loader import ConfigError, parse_config
from epp.extproc.parsers import DEFAULT_PARSERS, OPENAI
from epp.flowcontrol.config import Fairness

HEAD = {"apiVersion": "llm-d.ai/v1", "kind": "EndpointPickerConfig"}


def parsed(**fields: Any):
    return parse_config({**HEAD, **fields})


def errors(**fields: Any) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, **fields})
    return raised.value.errors


def test_the_older_api_version_loads_with_a_deprecation_warning() -> None:
    config = parse_config({**HEAD, "apiVersion": "inference.networking.x-k8s.io/v1alpha1"})
    assert any("deprecated" in warning for warning in config.warnings)


def test_feature_gates_default_and_read_name_or_name_equals_bool() -> None:
    assert parsed().feature_gates == {"flowControl": False, "haPopulateNonLeaderDatastore": True}
    gates = parsed(featureGates=["flowControl", "haPopulateNonLeaderDatastore=false"]).feature_gates
    assert gates == {"flowControl": True, "haPopulateNonLeaderDatastore": False}


def test_unknown_feature_gates_and_bad_values_are_errors() -> None:
    assert errors(featureGates=["nope", "flowControl=maybe"]) == [
        "featureGates[0]: unknown feature gate 'nope'; known: flowControl, "
        "haPopulateNonLeaderDatastore",
        "featureGates[1]: 'maybe' is not a valid value for the feature gate flowControl",
    ]


def test_flow_control_settings_without_the_gate_warn_that_the_reference_ignores_them() -> None:
    config = parsed(flowControl={"maxRequests": 10})
    assert any("featureGates: [flowControl]" in warning for warning in config.warnings)
    assert not parsed(featureGates=["flowControl"], flowControl={"maxRequests": 10}).warnings


def test_data_layer_defaults_to_a_metrics_source_with_the_core_extractor() -> None:
    assert parsed().data_layer == DataLayerConfig()
    (source,) = parsed().data_layer.metrics_sources()
    assert source.settings == MetricsSourceSettings()
    assert source.extractors == (("core-metrics-extractor", CoreMetricsSettings()),)


def test_data_layer_sources_carry_their_settings_and_extractors() -> None:
    layer = parsed(
        plugins=[
            {
                "type": "metrics-data-source",
                "name": "trt",
                "parameters": {"path": "/prometheus/metrics", "port": 9400, "interval": "1s"},
            },
            {
                "type": "core-metrics-extractor",
                "parameters": {"defaultEngine": "trtllm-serve"},
            },
        ],
        dataLayer={
            "sources": [
                {"pluginRef": "trt", "extractors": [{"pluginRef": "core-metrics-extractor"}]}
            ]
        },
    ).data_layer
    (source,) = layer.sources
    assert source.name == "trt"
    assert source.settings == MetricsSourceSettings(
        path="/prometheus/metrics", port=9400, interval=1.0
    )
    assert source.extractors == (
        ("core-metrics-extractor", CoreMetricsSettings(default_engine="trtllm-serve")),
    )


def test_inject_defaults_false_leaves_the_data_layer_empty() -> None:
    assert parsed(dataLayer={"injectDefaults": False}).data_layer.sources == ()


def test_an_unknown_engine_is_an_error_naming_the_known_ones() -> None:
    found = errors(
        plugins=[{"type": "core-metrics-extractor", "parameters": {"defaultEngine": "tgi"}}]
    )
    assert found == [
        "plugins[0].parameters.defaultEngine: unknown engine 'tgi'; known: vllm, sglang, "
        "trtllm-serve, triton-tensorrt-llm"
    ]


def test_data_layer_references_must_be_declared_sources() -> None:
    assert errors(dataLayer={"sources": [{"pluginRef": "nope"}], "bogus": 1}) == [
        "dataLayer.bogus: unknown field",
        "dataLayer.sources[0].pluginRef: no plugin named 'nope' in plugins",
    ]


def test_parsers_default_to_the_references_four() -> None:
    assert parsed().parsers == DEFAULT_PARSERS


def test_request_handler_parsers_and_the_deprecated_parser_key() -> None:
    assert parsed(
        plugins=[{"type": "openai-parser", "name": "oa"}],
        requestHandler={"parsers": [{"pluginRef": "oa"}]},
    ).parsers == (OPENAI,)
    legacy = parsed(parser={"pluginRef": "openai-parser"})
    assert legacy.parsers == (OPENAI,)
    assert any("requestHandler.parsers" in warning for warning in legacy.warnings)


def test_a_parser_reference_must_be_a_parser() -> None:
    assert errors(
        plugins=[{"type": "queue-scorer"}],
        requestHandler={"parsers": [{"pluginRef": "queue-scorer"}]},
    ) == ["requestHandler.parsers[0].pluginRef: queue-scorer is not a parser"]


def test_default_negative_priority_band_templates_negative_priorities_only() -> None:
    flow = parsed(
        flowControl={
            "defaultPriorityBand": {"maxRequests": 100},
            "defaultNegativePriorityBand": {
                "maxRequests": 10,
                "fairnessPolicyRef": "round-robin-fairness-policy",
            },
        }
    ).flow_control
    assert flow.band(-3).max_requests == 10 and flow.band(-3).fairness is Fairness.ROUND_ROBIN
    assert flow.band(0).max_requests == 100 and flow.band(0).fairness is Fairness.GLOBAL_STRICT


def test_quantities_are_read_for_request_counts() -> None:
    assert parsed(flowControl={"maxRequests": "2k"}).flow_control.max_requests == 2000


def test_a_saturation_detector_reference_must_be_a_detector() -> None:
    assert errors(
        plugins=[{"type": "queue-scorer"}],
        flowControl={"saturationDetector": {"pluginRef": "queue-scorer"}},
    ) == [
        "flowControl.saturationDetector.pluginRef: 'queue-scorer' is a queue-scorer (scorer), "
        "not a saturation-detector"
    ]


def test_the_deprecated_top_level_saturation_detector_is_read_when_flow_control_has_none() -> None:
    found = errors(
        plugins=[{"type": "queue-scorer"}], saturationDetector={"pluginRef": "queue-scorer"}
    )
    assert found[0].startswith("saturationDetector.pluginRef: 'queue-scorer' is a queue-scorer")


def test_unknown_keys_anywhere_name_their_path() -> None:
    assert errors(requestHandler={"parsers": [{"pluginRef": "openai-parser", "x": 1}]}) == [
        "requestHandler.parsers[0].x: unknown field"
    ]
