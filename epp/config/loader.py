"""The EPP's configuration file: `llm-d.ai/v1alpha1` `EndpointPickerConfig`.

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

Durations are Go duration strings ("60s", "500ms", "1m30s", "0s"); byte
sizes are integers or quantities ("1Gi", "500M"); see `epp.config.units`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from epp.config.datalayer import DEFAULT_SOURCES, DataLayerConfig, DataSourceConfig
from epp.config.fieldreader import FieldReader
from epp.config.plugin import Configured, Kind, ParameterError, Unsupported, read_parameters
from epp.config.registry import REGISTRY
from epp.config.units import parse_byte_size, parse_duration
from epp.extproc.parsers import DEFAULT_PARSERS, Parser
from epp.flowcontrol.config import (
    BandConfig,
    Fairness,
    FlowControlConfig,
    GateConfig,
    GateKind,
    Ordering,
    ProgramAwareConfig,
)
from epp.flowcontrol.usagelimits import StaticUsageLimit
from epp.scheduling.config import (
    MAX_SCORE_PICKER,
    SINGLE_PROFILE_HANDLER,
    ProfileConfig,
    SchedulingConfig,
    ScorerConfig,
)
from epp.scheduling.profiles import disagg_profile_handler, header_profile_handler
from epp.scheduling.saturation import SaturationThresholds
from epp.scheduling.sessions import SESSION_ID_DATA_KEY, attribute_key
from epp.scheduling.spec import PluginSpec, named

API_VERSION = "llm-d.ai/v1alpha1"
LEGACY_API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
API_VERSIONS = (API_VERSION, LEGACY_API_VERSION)
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

FAIRNESS_PLUGINS = {
    f"{policy.value}-fairness-policy": policy
    for policy in Fairness
    if policy is not Fairness.PROGRAM_AWARE
} | {"program-aware-fairness": Fairness.PROGRAM_AWARE}
ORDERING_PLUGINS = {f"{policy.value}-ordering-policy": policy for policy in Ordering}
SATURATION_FILTER = "saturation-filter"
PREFIX_PRODUCER = "approx-prefix-cache-producer"


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
class FlowPlugins:
    """The flow-control plugins a configuration names, as their factories
    made them (None: epp's gate, see `flowcontrol.config.GateConfig`)."""

    saturation_detector: Any = None
    usage_limit: Any = None
    eviction: tuple[Any, Any] | None = None
    """(filter, ordering) when `enableEviction` is set."""
    admitters: tuple[Any, ...] = ()


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
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """What loading noticed without refusing (logged by `epp serve`, printed
    by `epp validate`)."""


class _Reader(FieldReader):
    """Reads typed values and collects every error with its path."""

    def __init__(self) -> None:
        super().__init__()
        self.unsupported = False
        self.warnings: list[str] = []
        self.refused: set[str] = set()
        """Names of declared plugins refused as unsupported: references to
        them are not reported again."""

    def missing(self, path: str, name: str) -> None:
        """A reference to an undeclared plugin (quiet when it was refused)."""
        if name not in self.refused:
            self.fail(path, f"no plugin named {name!r} in plugins")

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}" if path else message)

    def quantity(self, value: Any, path: str, default: int) -> int:
        """A count written as an integer or a Kubernetes quantity ("5k")."""
        return self.size(value, path, default)

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
            size = parse_byte_size(value)
        except ValueError as error:
            self.fail(path, str(error))
            return default
        return size


@dataclass(slots=True, frozen=True)
class _Plugin:
    type: str
    kind: Kind
    parameters: Mapping[str, Any]
    """The checked parameters, defaults filled in."""
    value: Any
    """What the type's factory made of them."""
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
        registered = REGISTRY.get(plugin_type)
        if registered is None:
            reader.fail(
                f"{path}.type",
                f"unknown plugin type {plugin_type!r}; `epp plugins` lists the known ones",
            )
            continue
        if registered.reason is not None:
            reader.unsupported = True
            reader.fail(f"{path}.type", str(Unsupported(plugin_type, registered.reason)))
            name = fields.get("name", plugin_type)
            reader.refused.add(name if isinstance(name, str) else plugin_type)
            continue
        name = reader.string(fields.get("name", plugin_type), f"{path}.name")
        where = f"{path}.parameters"
        errors_before = len(reader.errors)
        parameters = read_parameters(reader, registered.parameters, fields.get("parameters"), where)
        if name is None:
            continue
        if name in plugins:
            reader.fail(f"{path}.name", f"duplicate plugin name {name!r}")
            continue
        if len(reader.errors) > errors_before:
            continue
        try:
            built = registered.build(parameters)
        except Unsupported as refusal:
            reader.unsupported = True
            reader.fail(f"{path}.type", str(refusal))
            reader.refused.add(name)
            continue
        except ParameterError as error:
            reader.fail(f"{where}.{error.field}" if error.field else where, str(error))
            continue
        if isinstance(built, PluginSpec):
            built = replace(named(built, name), type=plugin_type)
        if registered.deprecated_for is not None:
            reader.warn(
                f"{path}.type", f"{plugin_type!r} is deprecated; use {registered.deprecated_for!r}"
            )
        if registered.kind is Kind.PICKER and parameters["maxNumOfEndpoints"] > 1:
            reader.warn(
                f"{where}.maxNumOfEndpoints",
                "x-gateway-destination-endpoint lists the destination and its fallbacks; "
                "an Envoy ORIGINAL_DST cluster (config/envoy/envoy.yaml) reads one address "
                "and refuses a list: the gateway must take fallbacks",
            )
        plugins[name] = _Plugin(plugin_type, registered.kind, parameters, built, path)
    return plugins


_IN_PROFILES = (Kind.FILTER, Kind.SCORER, Kind.PICKER)


def _profile(
    reader: _Reader,
    value: Any,
    path: str,
    plugins: dict[str, _Plugin],
    default_picker: PluginSpec,
) -> ProfileConfig | None:
    fields = reader.mapping(value, path, {"name", "plugins"})
    name = reader.string(fields.get("name"), f"{path}.name")
    filters: list[PluginSpec] = []
    scorers: list[ScorerConfig] = []
    picker: PluginSpec | None = None
    for index, entry in enumerate(reader.sequence(fields.get("plugins"), f"{path}.plugins")):
        where = f"{path}.plugins[{index}]"
        entry_fields = reader.mapping(entry, where, {"pluginRef", "weight"})
        ref = reader.string(entry_fields.get("pluginRef"), f"{where}.pluginRef")
        if ref is None:
            continue
        plugin = plugins.get(ref)
        if plugin is None:
            reader.missing(f"{where}.pluginRef", ref)
            continue
        if plugin.kind is Kind.SCORER:
            weight = reader.number(entry_fields.get("weight"), f"{where}.weight", 1.0)
            scorers.append(ScorerConfig(plugin.value, weight))
            continue
        if "weight" in entry_fields:
            reader.fail(
                f"{where}.weight", f"only scorers take a weight, {ref!r} is a {plugin.type}"
            )
        if plugin.kind is Kind.PICKER:
            if picker is not None:
                reader.fail(f"{where}.pluginRef", "a profile has at most one picker")
            picker = plugin.value
        elif plugin.kind is Kind.FILTER:
            if isinstance(plugin.value, PluginSpec):
                filters.append(plugin.value)
        elif plugin.kind is not Kind.PROFILE_HANDLER:
            reader.fail(
                f"{where}.pluginRef", f"{plugin.type} ({plugin.kind}) does not belong in a profile"
            )
    if name is None:
        return None
    return ProfileConfig(name, tuple(filters), tuple(scorers), picker or default_picker)


def _profiles(
    reader: _Reader, value: Any, plugins: dict[str, _Plugin]
) -> tuple[ProfileConfig, ...] | None:
    """The profiles, as the reference fills them in: without any, one
    `default` profile of every declared filter, scorer and picker (None when
    there is none either: epp's default profile); a profile without a
    picker gets the first declared one, else max-score-picker."""
    declared_pickers = [p.value for p in plugins.values() if p.kind is Kind.PICKER]
    default_picker = declared_pickers[0] if declared_pickers else MAX_SCORE_PICKER
    entries = reader.sequence(value, "schedulingProfiles")
    if not entries:
        members = [p for p in plugins.values() if p.kind in _IN_PROFILES]
        if not members:
            return None
        return (
            ProfileConfig(
                "default",
                tuple(
                    p.value
                    for p in members
                    if p.kind is Kind.FILTER and isinstance(p.value, PluginSpec)
                ),
                tuple(ScorerConfig(p.value) for p in members if p.kind is Kind.SCORER),
                default_picker,
            ),
        )
    profiles: list[ProfileConfig] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        profile = _profile(reader, entry, f"schedulingProfiles[{index}]", plugins, default_picker)
        if profile is None:
            continue
        if profile.name in seen:
            reader.fail(f"schedulingProfiles[{index}].name", f"duplicate profile {profile.name!r}")
            continue
        seen.add(profile.name)
        profiles.append(profile)
    return tuple(profiles)


def _handler(
    reader: _Reader, plugins: dict[str, _Plugin], profiles: tuple[ProfileConfig, ...]
) -> PluginSpec:
    """The one profile handler, checked against the profiles; deciders
    resolved to their plugins."""
    handlers = [(name, p) for name, p in plugins.items() if p.kind is Kind.PROFILE_HANDLER]
    if len(handlers) > 1:
        names = ", ".join(name for name, _ in handlers)
        reader.fail("plugins", f"only one profile handler is allowed, got {names}")
    if not handlers:
        if len(profiles) > 1:
            reader.fail("plugins", "several scheduling profiles need a profile handler")
        return SINGLE_PROFILE_HANDLER
    _, handler = handlers[0]
    spec = handler.value
    names = [profile.name for profile in profiles]
    if handler.type in ("single-profile-handler", "data-parallel-profile-handler"):
        if len(profiles) > 1:
            reader.fail(
                f"{handler.path}.type",
                f"{handler.type} runs exactly one profile, got {len(profiles)}",
            )
        return spec
    arguments = dict(spec.arguments)
    if spec.make is header_profile_handler:
        if len(profiles) > 1 and arguments["default"] not in names:
            reader.warn(
                f"{handler.path}.parameters.defaultProfile",
                f"no scheduling profile named {arguments['default']!r}: requests without "
                f"the {arguments['header']} header will find no endpoint",
            )
        return spec
    legacy = handler.type == "pd-profile-handler"
    if arguments.get("decode", "decode") not in names:
        reader.fail(
            f"{handler.path}.parameters." + ("decodeProfile" if legacy else "profiles.decode"),
            f"no scheduling profile named {arguments.get('decode', 'decode')!r}",
        )
    for role in ("prefill_decider", "encode_decider"):
        ref = arguments.get(role)
        if ref is None:
            continue
        where = f"{handler.path}.parameters." + (
            "deciderPluginName" if legacy else f"deciders.{role.split('_')[0]}"
        )
        decider = plugins.get(ref)
        if decider is None:
            reader.missing(where, ref)
        elif decider.kind is not Kind.DECIDER:
            reader.fail(where, f"{ref!r} is a {decider.type}, not a decider")
        else:
            arguments[role] = decider.value
    return replace(spec, arguments=tuple(sorted(arguments.items())))


def _declared(reader: _Reader, plugins: dict[str, _Plugin], plugin_type: str) -> _Plugin:
    """The first declared plugin of `plugin_type`, or one with its defaults."""
    for plugin in plugins.values():
        if plugin.type == plugin_type:
            return plugin
    registered = REGISTRY.get(plugin_type)
    assert registered is not None, plugin_type
    parameters = read_parameters(reader, registered.parameters, None, "plugins")
    return _Plugin(plugin_type, registered.kind, parameters, Configured(plugin_type, parameters))


def _prefix_blocks(
    producer: _Plugin, defaults: SchedulingConfig
) -> tuple[int, int, int, bool, int]:
    """Block characters, blocks per prompt, LRU capacity, autoTune and
    maxPrefixTokensToMatch from the approx-prefix-cache-producer's
    parameters (4 characters per token)."""
    if producer.path == "":
        return (
            defaults.prefix_block_chars,
            defaults.prefix_max_blocks,
            defaults.prefix_lru_capacity,
            defaults.prefix_auto_tune,
            defaults.prefix_max_tokens,
        )
    parameters = producer.parameters
    tokens = parameters["blockSizeTokens"]
    if parameters["blockSize"] and tokens == 16:
        tokens = parameters["blockSize"]
    max_tokens = parameters["maxPrefixTokensToMatch"]
    blocks = max_tokens // tokens if max_tokens > 0 else parameters["maxPrefixBlocksToMatch"]
    return (
        tokens * 4,
        max(blocks, 1),
        parameters["lruCapacityPerServer"],
        parameters["autoTune"],
        max_tokens,
    )


def _scheduling(reader: _Reader, value: Any, plugins: dict[str, _Plugin]) -> SchedulingConfig:
    """Profiles and handler (defaults without any); the prefix index from
    the declared approx-prefix-cache-producer; the saturation filter's
    thresholds."""
    defaults = SchedulingConfig()
    profiles = _profiles(reader, value, plugins) or defaults.profiles
    handler = _handler(reader, plugins, profiles)
    block_chars, max_blocks, lru_capacity, auto_tune, max_tokens = _prefix_blocks(
        _declared(reader, plugins, PREFIX_PRODUCER), defaults
    )
    saturation_filter = _declared(reader, plugins, SATURATION_FILTER)
    parameters = saturation_filter.parameters
    try:
        saturation = SaturationThresholds(
            queue_depth=parameters["queueDepthThreshold"],
            kv_cache=parameters["kvCacheUtilThreshold"],
            staleness=parameters["metricsStalenessThreshold"],
        )
    except ValueError as error:
        reader.fail(f"{saturation_filter.path}.parameters", str(error))
        saturation = defaults.saturation
    _check_headers_handlers(reader, plugins, handler)
    _check_session_sources(reader, plugins)
    return SchedulingConfig(
        profiles=profiles,
        handler=handler,
        producers=tuple(
            p.value
            for p in plugins.values()
            if p.kind is Kind.PRODUCER and isinstance(p.value, PluginSpec)
        ),
        prefix_block_chars=block_chars,
        prefix_max_blocks=max_blocks,
        prefix_lru_capacity=lru_capacity,
        prefix_auto_tune=auto_tune,
        prefix_max_tokens=max_tokens,
        saturation=saturation,
    )


HEADERS_HANDLERS = ("disagg-headers-handler", "prefill-header-handler")
"""The deprecated plugins that wrote the disaggregation headers; epp's
disagg profile handler writes them itself, from its own profiles."""


def _check_headers_handlers(
    reader: _Reader, plugins: dict[str, _Plugin], handler: PluginSpec
) -> None:
    """A deprecated headers handler is accepted when it names the profiles
    the disagg handler writes the headers from (or there is none: it would
    find no prefill or encode result to write); otherwise it would mean
    something else than in the reference, so it is refused."""
    if handler.make is not disagg_profile_handler:
        return
    arguments = dict(handler.arguments)
    for plugin in plugins.values():
        if plugin.type not in HEADERS_HANDLERS:
            continue
        for parameter, role in (("prefillProfile", "prefill"), ("encodeProfile", "encode")):
            wanted = arguments.get(role, role)
            if wanted and plugin.parameters[parameter] != wanted:
                reader.fail(
                    f"{plugin.path}.parameters.{parameter}",
                    f"{plugin.parameters[parameter]!r} is not the profile handler's {role} "
                    f"profile {wanted!r}; epp writes the headers from the profile handler's "
                    "profiles",
                )


def _check_session_sources(reader: _Reader, plugins: dict[str, _Plugin]) -> None:
    """Warn about a session id source reading an attribute that no declared
    plugin publishes: it never yields a session id (the reference accepts it
    silently)."""
    published = {
        attribute_key(SESSION_ID_DATA_KEY, name)
        for name, plugin in plugins.items()
        if plugin.type == "session-id-producer"
    }
    for plugin in plugins.values():
        if not isinstance(plugin.value, PluginSpec):
            continue
        for key, sources in plugin.value.arguments:
            if key != "sources":
                continue
            for index, source in enumerate(sources):
                wanted = attribute_key(source.attribute, source.producer)
                if source.attribute and wanted not in published:
                    reader.warn(
                        f"{plugin.path}.parameters.sessionIdConfig.sources[{index}]",
                        f"no declared plugin publishes the attribute {wanted!r}, so this "
                        "source finds no session id (a session-id-producer publishes "
                        f"{SESSION_ID_DATA_KEY}/<its name>)",
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
        registered = REGISTRY.get(ref + suffix)
        if registered is not None and registered.supported:
            parameters = read_parameters(reader, registered.parameters, None, path)
            return _Plugin(registered.name, registered.kind, parameters, None)
    if ref not in reader.refused:
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
        max_requests=reader.quantity(
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
                input_weight=plugin.parameters.get("inputTokenWeight", 1.0),
                output_weight=plugin.parameters.get("outputTokenWeight", 2.0),
            )
            if band.fairness is Fairness.PROGRAM_AWARE:
                band = replace(band, program_aware=_program_aware(plugin.parameters))
    if "orderingPolicyRef" in fields:
        where = f"{path}.orderingPolicyRef"
        plugin = _policy_type(reader, fields["orderingPolicyRef"], where, plugins)
        if plugin is not None and plugin.type not in ORDERING_PLUGINS:
            reader.fail(where, f"{plugin.type} is not an ordering policy")
        elif plugin is not None:
            band = replace(band, ordering=ORDERING_PLUGINS[plugin.type])
    return band, fields


def _program_aware(parameters: Mapping[str, Any]) -> ProgramAwareConfig:
    return ProgramAwareConfig(
        weight_service=parameters["lasWeightService"],
        weight_head_wait=parameters["lasWeightHeadWait"],
        half_life=parameters["lasHalfLifeSeconds"],
        eviction_ttl=parameters["evictionTtlSeconds"],
        eviction_sweep=parameters["evictionSweepSeconds"],
    )


GATE_FIELDS = frozenset(
    {
        "kinds",
        "maxInFlight",
        "maxPerEndpoint",
        "maxPerPrefillEndpoint",
        "prefillTimeout",
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
        max_per_prefill_endpoint=reader.integer(
            fields.get("maxPerPrefillEndpoint"),
            "flowControl.gate.maxPerPrefillEndpoint",
            defaults.max_per_prefill_endpoint,
        ),
        prefill_timeout=_positive_duration(
            reader,
            fields.get("prefillTimeout"),
            "flowControl.gate.prefillTimeout",
            defaults.prefill_timeout,
        ),
    )


def _positive_duration(reader: _Reader, value: Any, path: str, default: float) -> float:
    seconds = reader.duration(value, path, default)
    if seconds is None or seconds <= 0:
        reader.fail(path, f"must be a positive duration, got {value!r}")
        return default
    return seconds


GATE_THRESHOLDS = {
    "queueDepthThreshold": "queue_depth",
    "kvCacheUtilThreshold": "kv_cache",
    "metricsStalenessThreshold": "staleness",
}
"""The gate's former copies of the saturation thresholds, by the field of
`SaturationThresholds` each one names."""


def _gate_thresholds(reader: _Reader, flow: Any, saturation: SaturationThresholds) -> None:
    """The gate's former threshold fields: accepted with a warning when they
    say what the saturation filter says (a configuration written before the
    thresholds were one set), refused when they differ."""
    gate = flow.get("gate") if isinstance(flow, Mapping) else None
    if not isinstance(gate, Mapping):
        return
    for name, field_name in GATE_THRESHOLDS.items():
        if name not in gate:
            continue
        path = f"flowControl.gate.{name}"
        expected = getattr(saturation, field_name)
        if field_name == "staleness":
            value = reader.duration(gate[name], path, expected)
        else:
            value = reader.number(gate[name], path, expected)
        where = f"the saturation thresholds are set once, in {SATURATION_FILTER}'s parameters"
        if value == expected:
            reader.warn(path, f"deprecated: {where}; this one says the same, so it is ignored")
        else:
            reader.fail(
                path, f"{value:g} differs from {SATURATION_FILTER}'s {name} {expected:g}: {where}"
            )


FLOW_CONTROL_FIELDS = frozenset(
    {
        "maxRequests",
        "maxBytes",
        "defaultRequestTTL",
        "noEndpointRequestTTL",
        "defaultPriorityBand",
        "defaultNegativePriorityBand",
        "priorityBands",
        "usageLimitPolicyPluginRef",
        "saturationDetector",
        "enableEviction",
        "flowIdleTimeout",
        "gate",
    }
)
EVICTION_PLUGINS = ("sheddable-eviction-filter", "priority-then-time-eviction-order-policy")
"""What `enableEviction` turns on, as in the reference."""


def _flow_control(
    reader: _Reader, value: Any, plugins: dict[str, _Plugin], template: BandConfig
) -> FlowControlConfig:
    defaults = FlowControlConfig()
    fields = reader.mapping(value, "flowControl", FLOW_CONTROL_FIELDS)
    default_band, _ = _band(
        reader,
        fields.get("defaultPriorityBand"),
        "flowControl.defaultPriorityBand",
        template,
        plugins,
        frozenset(),
    )
    negative_band = None
    if "defaultNegativePriorityBand" in fields:
        negative_band, _ = _band(
            reader,
            fields["defaultNegativePriorityBand"],
            "flowControl.defaultNegativePriorityBand",
            default_band,
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
    default_ttl = reader.duration(
        fields.get("defaultRequestTTL"), "flowControl.defaultRequestTTL", defaults.default_ttl
    )
    # Unset, it follows defaultRequestTTL (None), as the reference's does.
    no_endpoint_ttl = reader.duration(
        fields.get("noEndpointRequestTTL"), "flowControl.noEndpointRequestTTL", None
    )
    return FlowControlConfig(
        max_requests=reader.quantity(
            fields.get("maxRequests"), "flowControl.maxRequests", defaults.max_requests
        ),
        max_bytes=reader.size(fields.get("maxBytes"), "flowControl.maxBytes", defaults.max_bytes),
        default_ttl=default_ttl or 0.0,
        default_band=default_band,
        default_negative_band=negative_band,
        bands=tuple(sorted(bands, key=lambda band: -band.priority)),
        flow_idle_timeout=reader.duration(
            fields.get("flowIdleTimeout"), "flowControl.flowIdleTimeout", defaults.flow_idle_timeout
        )
        or 0.0,
        gate=_gate(reader, fields.get("gate")),
        no_endpoint_ttl=no_endpoint_ttl,
    )


def _plugin_of_kind(
    reader: _Reader, ref: Any, path: str, plugins: dict[str, _Plugin], kind: Kind
) -> Any:
    """What the factory made of the plugin `ref` names (a declared plugin,
    or a registered type used with its defaults, as the reference allows for
    its default plugins); None after reporting why it cannot be used."""
    name = reader.string(ref, path)
    if name is None or name in reader.refused:
        return None
    plugin = plugins.get(name)
    if plugin is None:
        registered = REGISTRY.get(name)
        if registered is None:
            reader.missing(path, name)
            return None
        plugin = _build_default(reader, registered.name, path)
        if plugin is None:
            return None
    if plugin.kind is not kind:
        reader.fail(path, f"{name!r} is a {plugin.type} ({plugin.kind}), not a {kind}")
        return None
    return plugin.value


def _build_default(reader: _Reader, plugin_type: str, path: str) -> _Plugin | None:
    registered = REGISTRY.get(plugin_type)
    assert registered is not None, plugin_type
    parameters = read_parameters(reader, registered.parameters, None, path)
    try:
        value = registered.build(parameters)
    except (Unsupported, ParameterError) as error:
        reader.unsupported = reader.unsupported or isinstance(error, Unsupported)
        reader.fail(path, str(error))
        return None
    if isinstance(value, PluginSpec):
        value = replace(named(value, plugin_type), type=plugin_type)
    return _Plugin(plugin_type, registered.kind, parameters, value, path)


def _flow_plugins(
    reader: _Reader, value: Any, legacy_detector: Any, plugins: dict[str, _Plugin]
) -> FlowPlugins:
    """The flow-control plugins `flowControl` names (the deprecated
    top-level `saturationDetector` when `flowControl` names none)."""
    fields = value if isinstance(value, Mapping) else {}
    detector = None
    section = fields.get("saturationDetector")
    where = "flowControl.saturationDetector"
    if section is None and legacy_detector is not None:
        section, where = legacy_detector, "saturationDetector"
        reader.warn(where, "deprecated; use flowControl.saturationDetector")
    if section is not None:
        ref = reader.mapping(section, where, {"pluginRef"}).get("pluginRef")
        if ref:
            detector = _plugin_of_kind(
                reader, ref, f"{where}.pluginRef", plugins, Kind.SATURATION_DETECTOR
            )
    usage_limit = None
    if fields.get("usageLimitPolicyPluginRef"):
        usage_limit = _plugin_of_kind(
            reader,
            fields["usageLimitPolicyPluginRef"],
            "flowControl.usageLimitPolicyPluginRef",
            plugins,
            Kind.USAGE_LIMIT,
        )
    eviction = None
    enable = fields.get("enableEviction", False)
    if not isinstance(enable, bool):
        reader.fail("flowControl.enableEviction", f"must be bool, got {enable!r}")
    elif enable:
        built = [
            _build_default(reader, name, "flowControl.enableEviction") for name in EVICTION_PLUGINS
        ]
        if all(plugin is not None for plugin in built):
            eviction = (built[0].value, built[1].value)  # type: ignore[union-attr]
    admitters = tuple(p.value for p in plugins.values() if p.kind is Kind.ADMITTER)
    return FlowPlugins(detector, usage_limit, eviction, admitters)


def _feature_gates(reader: _Reader, value: Any) -> dict[str, bool]:
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


def _data_layer(reader: _Reader, value: Any, plugins: dict[str, _Plugin]) -> DataLayerConfig:
    fields = reader.mapping(
        value,
        "dataLayer",
        {
            "sources",
            "discovery",
            "injectDefaults",
            "peerDiscovery",
            "crossReplicaSyncerPluginRef",
            "crossReplicaSyncInterval",
        },
    )
    sources: list[DataSourceConfig] = []
    for index, entry in enumerate(reader.sequence(fields.get("sources"), "dataLayer.sources")):
        path = f"dataLayer.sources[{index}]"
        source_fields = reader.mapping(entry, path, {"pluginRef", "extractors"})
        source = _referenced(reader, source_fields.get("pluginRef"), f"{path}.pluginRef", plugins)
        extractors = []
        for position, item in enumerate(
            reader.sequence(source_fields.get("extractors"), f"{path}.extractors")
        ):
            where = f"{path}.extractors[{position}]"
            ref = reader.mapping(item, where, {"pluginRef"}).get("pluginRef")
            extractor = _referenced(reader, ref, f"{where}.pluginRef", plugins)
            if extractor is not None:
                extractors.append((ref, extractor.value))
        if source is None:
            continue
        if source.kind is not Kind.DATA_SOURCE:
            reader.fail(f"{path}.pluginRef", f"{source.type} is not a data source")
            continue
        sources.append(
            DataSourceConfig(
                source_fields["pluginRef"], source.type, source.value, tuple(extractors)
            )
        )
    discovery = None
    if fields.get("discovery") is not None:
        ref = reader.mapping(fields["discovery"], "dataLayer.discovery", {"pluginRef"}).get(
            "pluginRef"
        )
        found = _referenced(reader, ref, "dataLayer.discovery.pluginRef", plugins)
        if found is not None:
            if found.kind is not Kind.DISCOVERY:
                reader.fail(
                    "dataLayer.discovery.pluginRef", f"{found.type} is not a discovery plugin"
                )
            else:
                discovery = (ref, found.value)
    for unsupported in ("peerDiscovery", "crossReplicaSyncerPluginRef"):
        if fields.get(unsupported):
            reader.unsupported = True
            reader.fail(
                f"dataLayer.{unsupported}", "not supported by epp: one EPP replica owns its state"
            )
    if fields.get("crossReplicaSyncInterval") is not None:
        reader.duration(
            fields["crossReplicaSyncInterval"], "dataLayer.crossReplicaSyncInterval", None
        )
    inject = fields.get("injectDefaults", True)
    if not isinstance(inject, bool):
        reader.fail("dataLayer.injectDefaults", f"must be bool, got {inject!r}")
        inject = True
    if inject and not any(source.type == "metrics-data-source" for source in sources):
        sources.extend(DEFAULT_SOURCES)
    return DataLayerConfig(tuple(sources), discovery)


def _referenced(
    reader: _Reader, ref: Any, path: str, plugins: dict[str, _Plugin]
) -> _Plugin | None:
    name = reader.string(ref, path)
    if name is None:
        return None
    plugin = plugins.get(name)
    if plugin is None:
        reader.missing(path, name)
    return plugin


def _parsers(
    reader: _Reader, value: Any, legacy: Any, plugins: dict[str, _Plugin]
) -> tuple[Parser, ...]:
    """Parser types in order: `requestHandler.parsers`, else the deprecated
    top-level `parser`, else the reference's four."""
    fields = reader.mapping(value, "requestHandler", {"parsers"})
    entries = [
        (f"requestHandler.parsers[{index}]", entry)
        for index, entry in enumerate(
            reader.sequence(fields.get("parsers"), "requestHandler.parsers")
        )
    ]
    if not entries and legacy is not None:
        reader.warn("parser", "deprecated; use requestHandler.parsers")
        entries = [("parser", legacy)]
    if not entries:
        return DEFAULT_PARSERS
    found: list[Parser] = []
    for path, entry in entries:
        ref = reader.mapping(entry, path, {"pluginRef"}).get("pluginRef")
        name = reader.string(ref, f"{path}.pluginRef")
        if name is None:
            continue
        plugin = plugins.get(name)
        if plugin is None and name in REGISTRY:
            plugin = _build_default(reader, name, f"{path}.pluginRef")
            if plugin is None:
                continue
        if plugin is None:
            reader.missing(f"{path}.pluginRef", name)
        elif plugin.kind is not Kind.PARSER:
            reader.fail(f"{path}.pluginRef", f"{plugin.type} is not a parser")
        else:
            found.append(plugin.value)
    return tuple(found)


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
    fields = reader.mapping(document, "", TOP_LEVEL_FIELDS)
    version = fields.get("apiVersion")
    if version not in API_VERSIONS:
        reader.fail(
            "apiVersion",
            f"must be {API_VERSION!r} (or the older {LEGACY_API_VERSION!r}), got {version!r}",
        )
    elif version == LEGACY_API_VERSION:
        reader.warn("apiVersion", f"{LEGACY_API_VERSION} is deprecated; use {API_VERSION}")
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
    plugins = _plugins(reader, fields.get("plugins"))
    template = replace(FlowControlConfig().default_band, fairness=DOCUMENT_FAIRNESS)
    flow_plugins = _flow_plugins(
        reader, fields.get("flowControl"), fields.get("saturationDetector"), plugins
    )
    flow_control = _flow_control(reader, fields.get("flowControl"), plugins, template)
    if flow_plugins.saturation_detector is not None:
        # The detector replaces the adaptive gate; the reference's default
        # ceiling is static 1.0.
        gate = replace(
            flow_control.gate,
            detector=flow_plugins.saturation_detector,
            usage_limits=flow_plugins.usage_limit or StaticUsageLimit(),
        )
        flow_control = replace(flow_control, gate=gate)
    elif flow_plugins.usage_limit is not None:
        # The adaptive gate applies the policy to each endpoint's learned limit.
        gate = replace(flow_control.gate, usage_limits=flow_plugins.usage_limit)
        flow_control = replace(flow_control, gate=gate)
    scheduling = _scheduling(reader, fields.get("schedulingProfiles"), plugins)
    _gate_thresholds(reader, flow_fields, scheduling.saturation)
    config = EppConfig(
        flow_control=flow_control,
        scheduling=scheduling,
        plugins=tuple((name, plugin.type) for name, plugin in plugins.items()),
        feature_gates=feature_gates,
        data_layer=_data_layer(reader, fields.get("dataLayer"), plugins),
        parsers=_parsers(reader, fields.get("requestHandler"), fields.get("parser"), plugins),
        flow_plugins=flow_plugins,
        warnings=tuple(reader.warnings),
    )
    if reader.errors:
        raise ConfigError(
            [error.removeprefix(".") for error in reader.errors], unsupported=reader.unsupported
        )
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
        raise ConfigError(error.errors, str(path), error.unsupported) from None
