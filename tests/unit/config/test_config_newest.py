"""What the reference added after the 2026-08 snapshot, as the configuration
reads it: the llm-d.ai/v1 kind, per-band TTLs, band selection, the
max-saturation-detector, detectors in profiles, stalenessPolicy,
models-responder and priority propagation."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.datalayer import FileDiscovery, ModelsSourceSettings
from epp.config.loader import ConfigError, parse_config
from epp.scheduling.detectors import (
    ConcurrencyDetector,
    MaxSaturationDetector,
    UtilizationDetector,
    detector_filter,
)

V1 = {"apiVersion": "llm-d.ai/v1", "kind": "EndpointPickerConfig"}
DISCOVERY = {"type": "file-discovery", "name": "disc", "parameters": {"path": "/e.yaml"}}


def parsed(**fields: Any):
    return parse_config({**V1, **fields})


def errors(**fields: Any) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config({**V1, **fields})
    return raised.value.errors


# -- llm-d.ai/v1 ---------------------------------------------------------------


def test_v1_loads_without_a_deprecation_warning() -> None:
    assert not [w for w in parsed().warnings if "deprecated" in w]


def test_v1alpha1_loads_as_v1_with_a_deprecation_warning_as_the_reference() -> None:
    config = parse_config({**V1, "apiVersion": "llm-d.ai/v1alpha1"})
    assert config == parsed()
    assert "apiVersion: llm-d.ai/v1alpha1 is deprecated; use llm-d.ai/v1" in config.warnings


def test_v1_discovery_is_under_endpoints() -> None:
    config = parsed(
        plugins=[DISCOVERY], dataLayer={"discovery": {"endpoints": {"pluginRef": "disc"}}}
    )
    assert config.data_layer.discovery == ("disc", FileDiscovery("/e.yaml"))


def test_v1alpha1s_bare_discovery_reference_is_read_with_a_warning() -> None:
    config = parsed(plugins=[DISCOVERY], dataLayer={"discovery": {"pluginRef": "disc"}})
    assert config.data_layer.discovery == ("disc", FileDiscovery("/e.yaml"))
    assert any(w.startswith("dataLayer.discovery.pluginRef: deprecated") for w in config.warnings)


@pytest.mark.parametrize(
    ("data_layer", "path"),
    [
        ({"crossReplica": {"syncerPluginRef": "s", "syncInterval": "500ms"}}, "crossReplica"),
        ({"crossReplicaSyncerPluginRef": "s"}, "crossReplicaSyncerPluginRef"),
        ({"discovery": {"peers": {"pluginRef": "p"}}}, "discovery.peers"),
    ],
)
def test_cross_replica_state_is_refused_in_either_version(data_layer, path) -> None:
    assert any(
        e.startswith(f"dataLayer.{path}") and "not supported" in e
        for e in errors(dataLayer=data_layer)
    )


# -- flow control ----------------------------------------------------------------


def test_a_bands_default_request_ttl_is_its_ttl() -> None:
    bands = parsed(flowControl={"priorityBands": [{"priority": 10, "defaultRequestTTL": "5s"}]})
    assert bands.flow_control.bands[0].ttl == 5.0


def test_a_band_takes_default_request_ttl_or_ttl_not_both() -> None:
    band = {"priority": 1, "defaultRequestTTL": "5s", "ttl": "6s"}
    assert errors(flowControl={"priorityBands": [band]}) == [
        "flowControl.priorityBands[0].ttl: give defaultRequestTTL or ttl, not both"
    ]


def test_the_strict_band_selection_policy_is_accepted() -> None:
    plugins = [{"type": "strict-band-selection-policy", "name": "strict"}]
    parsed(plugins=plugins, flowControl={"bandSelectionPolicyPluginRef": "strict"})
    parsed(flowControl={"bandSelectionPolicyPluginRef": "strict-band-selection-policy"})


def test_a_band_selection_reference_must_be_a_band_selection_policy() -> None:
    plugins = [{"type": "fcfs-ordering-policy", "name": "fcfs"}]
    assert (
        "not a band-selection-policy"
        in errors(plugins=plugins, flowControl={"bandSelectionPolicyPluginRef": "fcfs"})[0]
    )


def test_staleness_policy_ignore_is_read() -> None:
    plugins = [
        {"type": "utilization-detector", "name": "d", "parameters": {"stalenessPolicy": "ignore"}}
    ]
    gate = parsed(plugins=plugins, flowControl={"saturationDetector": {"pluginRef": "d"}})
    assert gate.flow_control.gate.detector.ignore_stale


def test_staleness_policy_takes_only_the_references_two_values() -> None:
    plugins = [{"type": "utilization-detector", "parameters": {"stalenessPolicy": "grace"}}]
    assert "stalenessPolicy: must be one of saturated, ignore" in errors(plugins=plugins)[0]


MAX = [
    {"type": "concurrency-detector", "name": "conc", "parameters": {"maxConcurrency": 32}},
    {"type": "utilization-detector", "name": "queue"},
]


def max_detector(**parameters: Any) -> list[dict]:
    return [*MAX, {"type": "max-saturation-detector", "name": "max", "parameters": parameters}]


def test_the_max_detector_gates_on_its_resolved_children() -> None:
    config = parsed(
        plugins=max_detector(detectors=["conc", "queue"], stages={"conc": ["decode"]}),
        flowControl={"saturationDetector": {"pluginRef": "max"}},
    )
    assert config.flow_control.gate.detector == MaxSaturationDetector(
        (ConcurrencyDetector(max_concurrency=32), UtilizationDetector()),
        (frozenset({"decode"}), frozenset()),
    )


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"detectors": []}, "detectors: needs at least one entry"),
        ({"detectors": ["conc", "conc"]}, "detectors: duplicate entry: conc"),
        ({"detectors": ["conc"], "stages": {"queue": ["decode"]}}, "stages.queue: is not listed"),
        ({"detectors": ["conc"], "stages": {"conc": []}}, "stages.conc: must name at least one"),
        ({"detectors": ["conc"], "stages": {"conc": ["encode"]}}, "unsupported stage 'encode'"),
    ],
)
def test_the_max_detectors_parameters_are_checked(parameters, message) -> None:
    found = errors(plugins=max_detector(**parameters))
    assert len(found) == 1 and message in found[0], found


def test_a_max_detector_child_must_be_a_declared_detector() -> None:
    found = errors(
        plugins=[*max_detector(detectors=["conc", "queue-scorer"])],
        flowControl={"saturationDetector": {"pluginRef": "max"}},
    )
    assert found == [
        "plugins[2].parameters.detectors[1]: 'queue-scorer' is a queue-scorer (scorer), "
        "not a saturation-detector"
    ]


def test_a_detector_in_a_profile_is_a_filter_of_that_profile() -> None:
    config = parsed(
        plugins=[*MAX, {"type": "max-score-picker"}],
        schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "conc"}]}],
    )
    (filter_spec,) = config.scheduling.profiles[0].filters
    assert (filter_spec.make, dict(filter_spec.arguments)) == (
        detector_filter,
        {"detector": ConcurrencyDetector(max_concurrency=32)},
    )


def test_a_max_detector_in_a_profile_is_refused_as_it_has_no_filter_role() -> None:
    found = errors(
        plugins=max_detector(detectors=["conc"]),
        schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "max"}]}],
    )
    assert found == [
        "schedulingProfiles[0].plugins[0].pluginRef: max-saturation-detector has no filter "
        "role (nor has the reference's); list its detectors in the profile"
    ]


# -- request handling ------------------------------------------------------------


def test_priority_propagation_is_off_unless_the_request_handler_turns_it_on() -> None:
    assert not parsed().propagate_priority
    assert parsed(requestHandler={"propagatePriority": True}).propagate_priority


def test_the_models_responder_reads_the_pods_lists_with_the_sources_defaults() -> None:
    config = parsed(plugins=[{"type": "models-responder"}])
    assert config.models == ModelsSourceSettings()
    assert any("does not narrow" in warning for warning in config.warnings)


def test_a_declared_models_data_source_overrides_the_responders_default() -> None:
    source = {"type": "models-data-source", "parameters": {"scheme": "https", "interval": "2s"}}
    config = parsed(plugins=[{"type": "models-responder"}, source])
    assert config.models == ModelsSourceSettings(scheme="https", interval=2.0)


def test_without_the_models_responder_no_model_list_is_read() -> None:
    config = parsed(plugins=[{"type": "models-data-source"}])
    assert config.models is None
    assert any("not polled" in warning for warning in config.warnings)
