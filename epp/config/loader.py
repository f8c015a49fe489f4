"""The EPP's configuration file: `llm-d.ai/v1` `EndpointPickerConfig` (the
deprecated `llm-d.ai/v1alpha1` and `inference.networking.x-k8s.io/v1alpha1`
are read too, with a warning, as the reference reads them).

Shaped like the reference EPP's file: `plugins` declares plugins by `type`
(and optional `name`, default the type) with `parameters`, each type and
its parameter schema taken from the plugin registry (`epp.config.registry`);
`schedulingProfiles` lists one profile whose `plugins` reference them by
`pluginRef` with a scorer `weight`; `flowControl` holds the queueing limits,
the default band template, the priority bands (whose fairness and ordering
policies are `...PolicyRef`s to declared plugins, or plain policy names) and
the gate. Every field has a default (see `config/epp/default.yaml`); an
unknown key or a bad value is an error naming its path, and all such errors
are reported together.

This module reads the top level (version, kind, feature gates) and hands
each section to its module in `epp.config.sections`; plugins are read
first, since every other section refers to them.

Durations are Go duration strings ("60s", "500ms", "1m30s", "0s"); byte
sizes are integers or quantities ("1Gi", "500M"); see `epp.api.units`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from epp.config.datalayer import DataLayerConfig, ModelsSourceSettings
from epp.config.plugin import Stability
from epp.config.precise import KVEventsSettings, TokenizerSettings
from epp.config.registry import REGISTRY
from epp.config.sections.datalayer import read_data_layer
from epp.config.sections.flowcontrol import (
    FlowPlugins,
    read_flow_control,
    read_flow_plugins,
    read_gate_thresholds,
)
from epp.config.sections.plugins import ConfigReader, read_plugins
from epp.config.sections.precise import read_precise
from epp.config.sections.profiles import read_scheduling
from epp.config.sections.requests import read_models, read_parsers, read_propagate_priority
from epp.extproc.parsers import DEFAULT_PARSERS, Parser
from epp.flowcontrol.config import Fairness, FlowControlConfig
from epp.scheduling.config import SchedulingConfig

API_VERSION = "llm-d.ai/v1"
DEPRECATED_API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
"""What the reference still reads, warning: v1alpha1 (the same fields, but
for `dataLayer.discovery.pluginRef` and `crossReplica*`, which v1 moved),
and its group before `llm-d.ai`."""
API_VERSIONS = (API_VERSION, *DEPRECATED_API_VERSIONS)
KIND = "EndpointPickerConfig"
TOP_LEVEL_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "featureGates",
        "plugins",
        "schedulingProfiles",
        "dataLayer",
        "flowControl",
        "requestHandler",
        "saturationDetector",
        "parser",
    }
)
FEATURE_GATES = {"flowControl": False, "haPopulateNonLeaderDatastore": True}
"""The reference's registered feature gates and their defaults."""

DOCUMENT_FAIRNESS = Fairness.GLOBAL_STRICT
"""A configuration file that names no fairness policy gets the reference's
default; epp's own default (no file at all) is VTC."""


class ConfigError(ValueError):
    """A configuration with errors; `errors` holds one "path: message" each."""

    def __init__(
        self, errors: list[str], source: str | None = None, unsupported: bool = False
    ) -> None:
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(prefix + error for error in errors))
        self.errors = errors
        self.unsupported = unsupported
        """Whether a declared plugin type is one epp cannot run (exit status 2)."""


@dataclass(slots=True, frozen=True)
class EppConfig:
    flow_control: FlowControlConfig = field(default_factory=FlowControlConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    plugins: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """(name, type) of each declared plugin, for checks made where the config
    is used; not part of what the config means."""
    feature_gates: Mapping[str, bool] = field(
        default_factory=lambda: {**FEATURE_GATES, "flowControl": True}
    )
    """As the file sets them; without a file, flowControl is on: epp's flow
    control always runs (config/epp/default.yaml says so)."""
    data_layer: DataLayerConfig = field(default_factory=DataLayerConfig)
    parsers: tuple[Parser, ...] = DEFAULT_PARSERS
    """The parsers, in the order they are registered (see `extproc.parsers`)."""
    flow_plugins: FlowPlugins = field(default_factory=FlowPlugins)
    tokenizer: TokenizerSettings | None = None
    """The declared token-producer, if any (`epp.config.precise`)."""
    kv_events: KVEventsSettings | None = None
    """Where the precise-prefix-cache-producer reads KV-cache events, if declared."""
    propagate_priority: bool = False
    """`requestHandler.propagatePriority`: the objective's priority goes into
    the forwarded body (`extproc.openai.engine_priority`)."""
    models: ModelsSourceSettings | None = None
    """Set when `models-responder` is declared: how the pods' model lists are
    read (the declared `models-data-source`, else its defaults)."""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """What loading noticed without refusing (logged by `epp serve`, printed
    by `epp validate`)."""


def _feature_gates(reader: ConfigReader, value: Any) -> dict[str, bool]:
    """The reference's gates: `name` or `name=bool`; unknown names are errors."""
    gates = dict(FEATURE_GATES)
    for index, entry in enumerate(reader.sequence(value, "featureGates")):
        path = f"featureGates[{index}]"
        text = reader.string(entry, path)
        if text is None:
            continue
        name, sep, raw = text.partition("=")
        if name not in FEATURE_GATES:
            known = ", ".join(FEATURE_GATES)
            reader.fail(path, f"unknown feature gate {name!r}; known: {known}")
            continue
        enabled = True
        if sep:
            flag = raw.strip().lower()
            if flag not in _GO_BOOLS:
                reader.fail(path, f"{raw!r} is not a valid value for the feature gate {name}")
                continue
            enabled = _GO_BOOLS[flag]
        gates[name] = enabled
    return gates


_GO_BOOLS = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}
"""strconv.ParseBool's spellings, lower-cased as the reference does."""


def is_config(obj: Any) -> bool:
    """Whether `obj` is meant as an EndpointPickerConfig (by its kind)."""
    return isinstance(obj, Mapping) and obj.get("kind") == KIND


def parse_config(document: Any) -> EppConfig:
    """An EppConfig from a parsed document; ConfigError lists every problem."""
    if document is None:
        return EppConfig()
    if not isinstance(document, Mapping):
        raise ConfigError([f"<document>: must be a mapping, got {type(document).__name__}"])
    reader = ConfigReader()
    fields = reader.mapping(document, "", TOP_LEVEL_FIELDS)
    version = fields.get("apiVersion")
    if version not in API_VERSIONS:
        older = " or ".join(repr(older) for older in DEPRECATED_API_VERSIONS)
        reader.fail(
            "apiVersion", f"must be {API_VERSION!r} (or the older {older}), got {version!r}"
        )
    elif version != API_VERSION:
        reader.warn("apiVersion", f"{version} is deprecated; use {API_VERSION}")
    if fields.get("kind") != KIND:
        reader.fail("kind", f"must be {KIND!r}, got {fields.get('kind')!r}")
    feature_gates = _feature_gates(reader, fields.get("featureGates"))
    flow_fields = fields.get("flowControl")
    if (
        not feature_gates["flowControl"]
        and isinstance(flow_fields, Mapping)
        and set(flow_fields) - {"saturationDetector"}
    ):
        reader.warn(
            "flowControl",
            "the reference ignores these settings without featureGates: [flowControl]; "
            "epp's flow control always runs and applies them",
        )
    plugins = read_plugins(reader, fields.get("plugins"))
    template = replace(FlowControlConfig().default_band, fairness=DOCUMENT_FAIRNESS)
    flow_plugins = read_flow_plugins(
        reader, fields.get("flowControl"), fields.get("saturationDetector"), plugins
    )
    flow_control = read_flow_control(
        reader, fields.get("flowControl"), plugins, template, flow_plugins
    )
    scheduling = read_scheduling(reader, fields.get("schedulingProfiles"), plugins)
    precise = read_precise(reader, plugins)
    scheduling = replace(scheduling, precise=precise.precise)
    read_gate_thresholds(reader, flow_fields, scheduling.saturation)
    config = EppConfig(
        flow_control=flow_control,
        scheduling=scheduling,
        plugins=tuple((name, plugin.type) for name, plugin in plugins.items()),
        feature_gates=feature_gates,
        data_layer=read_data_layer(reader, fields.get("dataLayer"), plugins),
        parsers=read_parsers(reader, fields.get("requestHandler"), fields.get("parser"), plugins),
        flow_plugins=flow_plugins,
        tokenizer=precise.tokenizer,
        kv_events=precise.kv_events,
        propagate_priority=read_propagate_priority(reader, fields.get("requestHandler")),
        models=read_models(reader, plugins),
        warnings=tuple(reader.warnings),
    )
    if reader.errors:
        raise ConfigError(
            [error.removeprefix(".") for error in reader.errors], unsupported=reader.unsupported
        )
    return config


def experimental_errors(config: EppConfig) -> list[str]:
    """What `epp serve` refuses without `--allow-experimental-plugins`, as
    the reference words it: each declared plugin of Alpha stability."""
    errors = []
    for name, plugin_type in config.plugins:
        entry = REGISTRY.get(plugin_type)
        if entry is not None and entry.stability is Stability.ALPHA:
            errors.append(
                f"plugin {name!r} (type: {plugin_type!r}) has Alpha stability level, but "
                "command line flag --allow-experimental-plugins is not set"
            )
    return errors


def load_config(path: str | Path) -> EppConfig:
    """Read and parse a configuration file (one YAML document)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        document = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError([f"cannot read: {error}"], str(path)) from None
    try:
        return parse_config(document)
    except ConfigError as error:
        raise ConfigError(error.errors, str(path), error.unsupported) from None
