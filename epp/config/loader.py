"""The EPP's configuration file: `llm-d.ai/v1alpha1` `EndpointPickerConfig`.

Shaped like the reference EPP's file: `plugins` declares plugins by `type`
(and optional `name`, default the type) with `parameters`;
`schedulingProfiles` lists one profile whose `plugins` reference them by
`pluginRef` with a scorer `weight`; `flowControl` holds the queueing limits,
the default band template, the priority bands (whose fairness and ordering
policies are `...PolicyRef`s to declared plugins, or plain policy names) and
the gate. Every field has a default (see `config/epp/default.yaml`); an
unknown key or a bad value is an error naming its path, and all such errors
are reported together.

Durations are Go-style strings ("60s", "500ms", "1m30s", "0s") or numbers of
seconds; byte sizes are integers or quantities ("1Gi", "500M").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from epp.config.fieldreader import FieldReader
from epp.flowcontrol.config import (
    BandConfig,
    Fairness,
    FlowControlConfig,
    GateConfig,
    GateKind,
    Ordering,
)
from epp.scheduling.config import SchedulingConfig, ScorerConfig

API_VERSION = "llm-d.ai/v1alpha1"
KIND = "EndpointPickerConfig"

SCORER_PARAMETERS: dict[str, frozenset[str]] = {
    "queue-scorer": frozenset(),
    "kv-cache-utilization-scorer": frozenset(),
    "lora-affinity-scorer": frozenset(),
    "prefix-cache-scorer": frozenset(
        {"hashBlockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer"}
    ),
}
SATURATION_FILTER = "saturation-filter"
SATURATION_PARAMETERS = frozenset(
    {"metricsStalenessThreshold", "queueDepthThreshold", "kvCacheUtilThreshold"}
)
PICKERS = frozenset({"max-score-picker", "random-picker", "weighted-random-picker"})
PROFILE_HANDLERS = frozenset({"single-profile-handler"})
FAIRNESS_PLUGINS = {f"{policy.value}-fairness-policy": policy for policy in Fairness}
ORDERING_PLUGINS = {f"{policy.value}-ordering-policy": policy for policy in Ordering}
VTC_PARAMETERS = frozenset({"inputTokenWeight", "outputTokenWeight"})

PLUGIN_PARAMETERS: dict[str, frozenset[str]] = {
    **SCORER_PARAMETERS,
    **dict.fromkeys(PICKERS | PROFILE_HANDLERS, frozenset()),
    **dict.fromkeys(FAIRNESS_PLUGINS, frozenset()),
    **dict.fromkeys(ORDERING_PLUGINS, frozenset()),
    "vtc-fairness-policy": VTC_PARAMETERS,
    SATURATION_FILTER: SATURATION_PARAMETERS,
}

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|K|M|G|T)?$")
_QUANTITY_UNITS = {
    None: 1,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
}


class ConfigError(ValueError):
    """A configuration with errors; `errors` holds one "path: message" each."""

    def __init__(self, errors: list[str], source: str | None = None) -> None:
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(prefix + error for error in errors))
        self.errors = errors


@dataclass(slots=True, frozen=True)
class EppConfig:
    flow_control: FlowControlConfig = field(default_factory=FlowControlConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)


def parse_duration(value: Any) -> float:
    """Seconds from a Go duration string or a number; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if body == "0":
            return 0.0
        parts = _DURATION_PART.findall(body)
        if not parts or "".join(number + unit for number, unit in parts) != body:
            raise ValueError(f'invalid duration {value!r}; use e.g. "60s", "500ms", "1m30s"')
        seconds = sign * sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
    else:
        raise ValueError(f"must be a duration, got {value!r}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"must be a finite duration, got {value!r}")
    return seconds


def parse_bytes(value: Any) -> int:
    """Bytes from an integer or a quantity string; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and (match := _QUANTITY.match(value.strip())):
        return int(match.group(1)) * _QUANTITY_UNITS[match.group(2)]
    raise ValueError(f'must be a byte count or quantity such as "1Gi", got {value!r}')


class _Reader(FieldReader):
    """Reads typed values and collects every error with its path."""

    def integer(self, value: Any, path: str, default: int, minimum: int | None = 0) -> int:
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(path, f"must be an integer, got {value!r}")
            return default
        if minimum is not None and value < minimum:
            self.fail(path, f"must be at least {minimum}, got {value}")
            return default
        return value

    def number(
        self,
        value: Any,
        path: str,
        default: float,
        minimum: float = 0.0,
        maximum: float | None = None,
    ) -> float:
        if value is None:
            return default
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            self.fail(path, f"must be a number, got {value!r}")
            return default
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            self.fail(path, f"must be {bound}, got {value}")
            return default
        return float(value)

    def string(self, value: Any, path: str) -> str | None:
        if not isinstance(value, str) or not value:
            self.fail(path, f"must be a non-empty string, got {value!r}")
            return None
        return value

    def duration(self, value: Any, path: str, default: float | None) -> float | None:
        if value is None:
            return default
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            self.fail(path, str(error))
            return default
        if seconds < 0:
            self.fail(path, f"must not be negative, got {value!r}")
            return default
        return seconds

    def size(self, value: Any, path: str, default: int) -> int:
        if value is None:
            return default
        try:
            size = parse_bytes(value)
        except ValueError as error:
            self.fail(path, str(error))
            return default
        return size


@dataclass(slots=True, frozen=True)
class _Plugin:
    type: str
    parameters: Mapping[str, Any]
    path: str = ""
    """Where the plugin was declared, for errors in its parameters."""


def _plugins(reader: _Reader, value: Any) -> dict[str, _Plugin]:
    plugins: dict[str, _Plugin] = {}
    for index, entry in enumerate(reader.sequence(value, "plugins")):
        path = f"plugins[{index}]"
        fields = reader.mapping(entry, path, {"type", "name", "parameters"})
        plugin_type = reader.string(fields.get("type"), f"{path}.type")
        if plugin_type is None:
            continue
        if plugin_type not in PLUGIN_PARAMETERS:
            known = ", ".join(sorted(PLUGIN_PARAMETERS))
            reader.fail(f"{path}.type", f"unknown plugin type {plugin_type!r}; known: {known}")
            continue
        name = reader.string(fields.get("name", plugin_type), f"{path}.name")
        parameters = reader.mapping(
            fields.get("parameters"), f"{path}.parameters", PLUGIN_PARAMETERS[plugin_type]
        )
        if name is None:
            continue
        if name in plugins:
            reader.fail(f"{path}.name", f"duplicate plugin name {name!r}")
            continue
        plugins[name] = _Plugin(plugin_type, parameters, path)
    return plugins


def _profile(
    reader: _Reader, profiles: list[Any], plugins: dict[str, _Plugin]
) -> tuple[tuple[ScorerConfig, ...], str]:
    if len(profiles) > 1:
        reader.fail("schedulingProfiles", f"exactly one profile is supported, got {len(profiles)}")
    profile = reader.mapping(profiles[0], "schedulingProfiles[0]", {"name", "plugins"})
    reader.string(profile.get("name"), "schedulingProfiles[0].name")
    scorers: list[ScorerConfig] = []
    picker = SchedulingConfig().picker
    pickers = 0
    entries = reader.sequence(profile.get("plugins"), "schedulingProfiles[0].plugins")
    for index, entry in enumerate(entries):
        path = f"schedulingProfiles[0].plugins[{index}]"
        fields = reader.mapping(entry, path, {"pluginRef", "weight"})
        ref = reader.string(fields.get("pluginRef"), f"{path}.pluginRef")
        if ref is None:
            continue
        plugin = plugins.get(ref)
        if plugin is None:
            reader.fail(f"{path}.pluginRef", f"no plugin named {ref!r} in plugins")
            continue
        if plugin.type in SCORER_PARAMETERS:
            weight = reader.number(fields.get("weight"), f"{path}.weight", 1.0)
            scorers.append(ScorerConfig(plugin.type, weight))
            continue
        if "weight" in fields:
            reader.fail(f"{path}.weight", f"only scorers take a weight, {ref!r} is a {plugin.type}")
        if plugin.type in PICKERS:
            picker = plugin.type
            pickers += 1
            if pickers > 1:
                reader.fail(f"{path}.pluginRef", "a profile has at most one picker")
        elif plugin.type not in PROFILE_HANDLERS and plugin.type != SATURATION_FILTER:
            reader.fail(
                f"{path}.pluginRef", f"{plugin.type} does not belong in a scheduling profile"
            )
    return tuple(scorers), picker


def _declared(plugins: dict[str, _Plugin], plugin_type: str) -> _Plugin:
    """The first declared plugin of `plugin_type`, or one with no parameters."""
    return next(
        (plugin for plugin in plugins.values() if plugin.type == plugin_type),
        _Plugin(plugin_type, {}, "plugins"),
    )


def _scheduling(reader: _Reader, value: Any, plugins: dict[str, _Plugin]) -> SchedulingConfig:
    """Scorers and picker from the profile (defaults without one); plugin
    parameters from the declared prefix-cache scorer and saturation filter."""
    defaults = SchedulingConfig()
    profiles = reader.sequence(value, "schedulingProfiles")
    scorers, picker = _profile(reader, profiles, plugins) if profiles else (None, defaults.picker)
    prefix_plugin = _declared(plugins, "prefix-cache-scorer")
    prefix, where = prefix_plugin.parameters, f"{prefix_plugin.path}.parameters"
    saturation_plugin = _declared(plugins, SATURATION_FILTER)
    saturation, filter_where = saturation_plugin.parameters, f"{saturation_plugin.path}.parameters"
    return SchedulingConfig(
        scorers=defaults.scorers if scorers is None else scorers,
        picker=picker,
        prefix_block_chars=reader.integer(
            prefix.get("hashBlockSize"), f"{where}.hashBlockSize", defaults.prefix_block_chars, 1
        ),
        prefix_max_blocks=reader.integer(
            prefix.get("maxPrefixBlocksToMatch"),
            f"{where}.maxPrefixBlocksToMatch",
            defaults.prefix_max_blocks,
            1,
        ),
        prefix_lru_capacity=reader.integer(
            prefix.get("lruCapacityPerServer"),
            f"{where}.lruCapacityPerServer",
            defaults.prefix_lru_capacity,
            1,
        ),
        metrics_staleness=reader.duration(
            saturation.get("metricsStalenessThreshold"),
            f"{filter_where}.metricsStalenessThreshold",
            defaults.metrics_staleness,
        )
        or 0.0,
        saturation_queue_depth=reader.number(
            saturation.get("queueDepthThreshold"),
            f"{filter_where}.queueDepthThreshold",
            defaults.saturation_queue_depth,
        ),
        saturation_kv_cache=reader.number(
            saturation.get("kvCacheUtilThreshold"),
            f"{filter_where}.kvCacheUtilThreshold",
            defaults.saturation_kv_cache,
            maximum=1.0,
        ),
    )


BAND_FIELDS = frozenset(
    {"maxRequests", "maxBytes", "ttl", "fairnessPolicyRef", "orderingPolicyRef"}
)


def _policy_type(
    reader: _Reader, value: Any, path: str, plugins: dict[str, _Plugin]
) -> _Plugin | None:
    ref = reader.string(value, path)
    if ref is None:
        return None
    if ref in plugins:
        return plugins[ref]
    for suffix in ("", "-fairness-policy", "-ordering-policy"):
        if ref + suffix in PLUGIN_PARAMETERS:
            return _Plugin(ref + suffix, {})
    reader.fail(path, f"no plugin named {ref!r} and no such policy")
    return None


def _band(
    reader: _Reader,
    value: Any,
    path: str,
    template: BandConfig,
    plugins: dict[str, _Plugin],
    extra: frozenset[str],
) -> tuple[BandConfig, dict[str, Any]]:
    fields = reader.mapping(value, path, BAND_FIELDS | extra)
    band = replace(
        template,
        max_requests=reader.integer(
            fields.get("maxRequests"), f"{path}.maxRequests", template.max_requests
        ),
        max_bytes=reader.size(fields.get("maxBytes"), f"{path}.maxBytes", template.max_bytes),
        ttl=reader.duration(fields.get("ttl"), f"{path}.ttl", template.ttl) or None,
    )
    if "fairnessPolicyRef" in fields:
        where = f"{path}.fairnessPolicyRef"
        plugin = _policy_type(reader, fields["fairnessPolicyRef"], where, plugins)
        if plugin is not None and plugin.type not in FAIRNESS_PLUGINS:
            reader.fail(where, f"{plugin.type} is not a fairness policy")
        elif plugin is not None:
            band = replace(
                band,
                fairness=FAIRNESS_PLUGINS[plugin.type],
                input_weight=reader.number(
                    plugin.parameters.get("inputTokenWeight"),
                    f"{plugin.path}.parameters.inputTokenWeight",
                    1.0,
                ),
                output_weight=reader.number(
                    plugin.parameters.get("outputTokenWeight"),
                    f"{plugin.path}.parameters.outputTokenWeight",
                    2.0,
                ),
            )
    if "orderingPolicyRef" in fields:
        where = f"{path}.orderingPolicyRef"
        plugin = _policy_type(reader, fields["orderingPolicyRef"], where, plugins)
        if plugin is not None and plugin.type not in ORDERING_PLUGINS:
            reader.fail(where, f"{plugin.type} is not an ordering policy")
        elif plugin is not None:
            band = replace(band, ordering=ORDERING_PLUGINS[plugin.type])
    return band, fields


GATE_FIELDS = frozenset(
    {
        "kinds",
        "maxInFlight",
        "maxPerEndpoint",
        "queueDepthThreshold",
        "kvCacheUtilThreshold",
        "metricsStalenessThreshold",
    }
)


def _gate(reader: _Reader, value: Any) -> GateConfig:
    defaults = GateConfig()
    fields = reader.mapping(value, "flowControl.gate", GATE_FIELDS)
    kinds = defaults.kinds
    if "kinds" in fields:
        chosen: set[GateKind] = set()
        for index, kind in enumerate(reader.sequence(fields["kinds"], "flowControl.gate.kinds")):
            try:
                chosen.add(GateKind(kind))
            except ValueError:
                known = ", ".join(k.value for k in GateKind)
                reader.fail(
                    f"flowControl.gate.kinds[{index}]", f"unknown gate {kind!r}; known: {known}"
                )
        kinds = frozenset(chosen)
    return GateConfig(
        kinds=kinds,
        max_in_flight=reader.integer(
            fields.get("maxInFlight"), "flowControl.gate.maxInFlight", defaults.max_in_flight
        ),
        max_per_endpoint=reader.integer(
            fields.get("maxPerEndpoint"),
            "flowControl.gate.maxPerEndpoint",
            defaults.max_per_endpoint,
        ),
        queue_depth_threshold=reader.number(
            fields.get("queueDepthThreshold"),
            "flowControl.gate.queueDepthThreshold",
            defaults.queue_depth_threshold,
        ),
        kv_cache_threshold=reader.number(
            fields.get("kvCacheUtilThreshold"),
            "flowControl.gate.kvCacheUtilThreshold",
            defaults.kv_cache_threshold,
            maximum=1.0,
        ),
        metrics_staleness=reader.duration(
            fields.get("metricsStalenessThreshold"),
            "flowControl.gate.metricsStalenessThreshold",
            defaults.metrics_staleness,
        )
        or 0.0,
    )


FLOW_CONTROL_FIELDS = frozenset(
    {
        "maxRequests",
        "maxBytes",
        "defaultRequestTTL",
        "flowIdleTimeout",
        "defaultPriorityBand",
        "priorityBands",
        "gate",
    }
)


def _flow_control(reader: _Reader, value: Any, plugins: dict[str, _Plugin]) -> FlowControlConfig:
    defaults = FlowControlConfig()
    fields = reader.mapping(value, "flowControl", FLOW_CONTROL_FIELDS)
    default_band, _ = _band(
        reader,
        fields.get("defaultPriorityBand"),
        "flowControl.defaultPriorityBand",
        defaults.default_band,
        plugins,
        frozenset(),
    )
    bands: list[BandConfig] = []
    seen: set[int] = set()
    for index, entry in enumerate(
        reader.sequence(fields.get("priorityBands"), "flowControl.priorityBands")
    ):
        path = f"flowControl.priorityBands[{index}]"
        band, band_fields = _band(
            reader, entry, path, default_band, plugins, frozenset({"priority"})
        )
        if "priority" not in band_fields:
            reader.fail(f"{path}.priority", "required")
            continue
        priority = reader.integer(band_fields["priority"], f"{path}.priority", 0, minimum=-(2**31))
        if priority in seen:
            reader.fail(f"{path}.priority", f"duplicate band for priority {priority}")
            continue
        seen.add(priority)
        bands.append(replace(band, priority=priority))
    return FlowControlConfig(
        max_requests=reader.integer(
            fields.get("maxRequests"), "flowControl.maxRequests", defaults.max_requests
        ),
        max_bytes=reader.size(fields.get("maxBytes"), "flowControl.maxBytes", defaults.max_bytes),
        default_ttl=reader.duration(
            fields.get("defaultRequestTTL"), "flowControl.defaultRequestTTL", defaults.default_ttl
        )
        or 0.0,
        default_band=default_band,
        bands=tuple(sorted(bands, key=lambda band: -band.priority)),
        flow_idle_timeout=reader.duration(
            fields.get("flowIdleTimeout"), "flowControl.flowIdleTimeout", defaults.flow_idle_timeout
        )
        or 0.0,
        gate=_gate(reader, fields.get("gate")),
    )


def is_config(obj: Any) -> bool:
    """Whether `obj` is meant as an EndpointPickerConfig (by its kind)."""
    return isinstance(obj, Mapping) and obj.get("kind") == KIND


def parse_config(document: Any) -> EppConfig:
    """An EppConfig from a parsed document; ConfigError lists every problem."""
    if document is None:
        return EppConfig()
    if not isinstance(document, Mapping):
        raise ConfigError([f"<document>: must be a mapping, got {type(document).__name__}"])
    reader = _Reader()
    fields = reader.mapping(
        document, "", {"apiVersion", "kind", "plugins", "schedulingProfiles", "flowControl"}
    )
    if fields.get("apiVersion") != API_VERSION:
        reader.fail("apiVersion", f"must be {API_VERSION!r}, got {fields.get('apiVersion')!r}")
    if fields.get("kind") != KIND:
        reader.fail("kind", f"must be {KIND!r}, got {fields.get('kind')!r}")
    plugins = _plugins(reader, fields.get("plugins"))
    config = EppConfig(
        flow_control=_flow_control(reader, fields.get("flowControl"), plugins),
        scheduling=_scheduling(reader, fields.get("schedulingProfiles"), plugins),
    )
    if reader.errors:
        raise ConfigError([error.removeprefix(".") for error in reader.errors])
    return config


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
        raise ConfigError(error.errors, str(path)) from None
