"""The plugin registry: one entry per type, read by loading, `epp plugins`
and the docs' plugin catalogue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epp.api.units import parse_duration
from epp.cli import docgen, main
from epp.config.loader import ConfigError, parse_config
from epp.config.plugin import Kind, Param, ParamType, PluginType, Unsupported, configured
from epp.config.registry import REGISTRY, Registry, markdown_table

ROOT = Path(__file__).parents[3]
HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def test_the_docs_plugin_catalogue_is_the_registry() -> None:
    assert docgen.current("plugins") is not None, "docs/configuration/plugins.md lost its table"
    assert docgen.current("plugins") == markdown_table(), (
        "the plugin catalogue is stale: run python3 -m epp.cli.docgen plugins"
    )


def test_a_type_is_registered_once() -> None:
    entry = PluginType("x", Kind.SCORER, "x", factory=configured)
    with pytest.raises(ValueError, match="registered twice"):
        Registry((entry, entry))


def test_a_type_without_a_typed_configuration_builds_as_itself_with_its_parameters() -> None:
    entry = PluginType("x-policy", Kind.ORDERING, "x", (Param("n", ParamType.INT, 2),), configured)
    built = entry.build({"n": 3})
    assert (built.type, built.parameters) == ("x-policy", {"n": 3})


def test_an_entry_has_a_factory_or_a_refusal() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        PluginType("x", Kind.SCORER, "x")


@pytest.mark.parametrize(
    "name",
    [
        "decode-filter",
        "prefill-filter",
        "encode-filter",
        "label-selector-filter",
        "prefix-cache-affinity-filter",
        "load-aware-scorer",
        "active-request-scorer",
        "running-requests-size-scorer",
        "token-load-scorer",
        "no-hit-lru-scorer",
        "session-affinity-scorer",
        "context-length-aware",
        "random-picker",
        "weighted-random-picker",
        "single-profile-handler",
        "disagg-profile-handler",
        "always-disagg-pd-decider",
        "prefix-based-pd-decider",
        "always-disagg-multimodal-decider",
        "data-parallel-profile-handler",
        "approx-prefix-cache-producer",
        "precise-prefix-cache-producer",
        "token-producer",
        "inflight-load-producer",
        "session-id-producer",
        "metrics-data-source",
        "core-metrics-extractor",
        "endpoint-notification-source",
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "passthrough-parser",
        "global-strict-fairness-policy",
        "round-robin-fairness-policy",
        "program-aware-fairness",
        "fcfs-ordering-policy",
        "edf-ordering-policy",
        "slo-deadline-ordering-policy",
        "utilization-detector",
        "concurrency-detector",
        "static-usage-limit-policy",
        "priority-holdback-policy",
        "soft-reflective-ceiling-policy",
        "probabilistic-admitter",
        "sheddable-eviction-filter",
        "priority-then-time-eviction-order-policy",
    ],
)
def test_every_reference_type_of_the_issue_is_registered(name: str) -> None:
    assert name in REGISTRY


@pytest.mark.parametrize(
    "name",
    [
        "mm-embeddings-cache-producer",
        "mm-embeddings-cache-scorer",
        "dcgm-data-source",
        "dcgm-extractor",
        "topology-extractor",
        "topology-affinity-scorer",
        "endpoint-attribute-filter",
        "endpoint-attribute-scorer",
        "burst-prefix-cache-producer",
        "predicted-latency-producer",
    ],
)
def test_types_that_need_what_epp_cannot_run_are_refused_with_a_reason(name: str) -> None:
    entry = REGISTRY.get(name)
    assert entry is not None and not entry.supported
    with pytest.raises(Unsupported) as raised:
        entry.build({})
    assert str(raised.value).startswith(f"plugin type {name!r} is not supported by epp: ")
    assert raised.value.reason


def test_the_removed_precise_scorer_points_to_its_replacement() -> None:
    entry = REGISTRY.get("precise-prefix-cache-scorer")
    assert entry is not None and not entry.supported
    with pytest.raises(Unsupported) as raised:
        entry.build({})
    assert "precise-prefix-cache-producer with prefix-cache-scorer" in raised.value.reason


def test_every_supported_type_builds_from_its_defaults() -> None:
    from epp.config.fieldreader import FieldReader
    from epp.config.plugin import read_parameters

    # session-id-producer needs one of two parameters, a rule no schema default meets.
    for entry in REGISTRY:
        if entry.name == "session-id-producer":
            continue
        if entry.supported and not any(param.required for param in entry.parameters):
            reader = FieldReader()
            entry.build(read_parameters(reader, entry.parameters, None, "p"))
            assert reader.errors == [], entry.name


def test_a_refused_type_in_a_config_names_type_and_reason() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, "plugins": [{"type": "dcgm-extractor"}]})
    assert raised.value.unsupported
    assert raised.value.errors == [
        "plugins[0].type: plugin type 'dcgm-extractor' is not supported by epp: needs the "
        "NVIDIA DCGM exporter's GPU metrics, which epp does not scrape"
    ]


def test_parameters_are_checked_against_the_schema() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(
            {
                **HEAD,
                "plugins": [
                    {
                        "type": "approx-prefix-cache-producer",
                        "parameters": {"autoTune": "yes", "blockSizeTokens": 1.5, "nope": 1},
                    }
                ],
            }
        )
    assert sorted(raised.value.errors) == [
        "plugins[0].parameters.autoTune: must be true or false, got 'yes'",
        "plugins[0].parameters.blockSizeTokens: must be an integer, got 1.5",
        "plugins[0].parameters.nope: unknown field",
    ]


def test_name_defaults_to_the_type() -> None:
    config = parse_config(
        {
            **HEAD,
            "plugins": [{"type": "random-picker"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "random-picker"}]}],
        }
    )
    assert config.scheduling.profiles[0].picker.name == "random-picker"


def test_param_bounds_can_be_exclusive() -> None:
    schema = (Param("x", ParamType.FLOAT, 1.0, "", 0, 1, True),)
    from epp.config.fieldreader import FieldReader
    from epp.config.plugin import read_parameters

    reader = FieldReader()
    assert read_parameters(reader, schema, {"x": 1}, "p") == {"x": 1}
    read_parameters(reader, schema, {"x": 0}, "p")
    assert reader.errors == ["p.x: must be in (0, 1], got 0"]


def test_epp_plugins_lists_every_type(capsys) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for entry in REGISTRY:
        assert entry.name in out
    assert out.splitlines()[-1].startswith(f"{len(REGISTRY)} plugin types")


def test_epp_plugins_json_describes_kind_parameters_and_support(capsys) -> None:
    assert main(["plugins", "--json"]) == 0
    listed = {entry["type"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert set(listed) == {entry.name for entry in REGISTRY}
    producer = listed["approx-prefix-cache-producer"]
    assert producer["kind"] == "producer" and producer["supported"]
    assert {key: producer["parameters"][1][key] for key in ("name", "type", "default")} == {
        "name": "blockSizeTokens",
        "type": "int",
        "default": 16,
    }
    assert not listed["dcgm-extractor"]["supported"]
    assert listed["dcgm-extractor"]["reason"]


def test_epp_plugins_writes_durations_as_the_configuration_must(capsys) -> None:
    assert main(["plugins"]) == 0
    durations = [
        line.split(" = ", 1)[1]
        for line in capsys.readouterr().out.splitlines()
        if ": duration = " in line
    ]
    assert "200ms" in durations
    for text in durations:
        parse_duration(text)
    document = {
        **HEAD,
        "plugins": [
            {"type": "saturation-filter", "parameters": {"metricsStalenessThreshold": "200ms"}}
        ],
    }
    assert parse_config(document).scheduling.saturation.staleness == 0.2


def test_epp_plugins_shows_each_types_stability(capsys) -> None:
    assert main(["plugins"]) == 0
    rows = {
        line.split()[0]: line.split()[2]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("  ") and not line.startswith("      ")
    }
    assert rows["session-affinity-scorer"] == "alpha"
    assert rows["queue-scorer"] == "beta"


def test_the_plugin_table_shows_each_types_stability() -> None:
    rows = [line.split(" | ") for line in markdown_table().splitlines()[2:]]
    assert {row[0]: row[2] for row in rows}["| `session-affinity-scorer`"] == "alpha"
