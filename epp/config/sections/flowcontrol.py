"""The `flowControl` section (and the deprecated top-level
`saturationDetector`): limits, the default and negative band templates, the
priority bands with their fairness and ordering policies, the gate, and the
flow-control plugins it names (saturation detector, usage-limit policy,
eviction, admitters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from epp.config.catalog.flowcontrol import MaxDetectorRefs
from epp.config.fieldreader import POSITIVE, Bounds
from epp.config.plugin import Kind, read_parameters
from epp.config.registry import REGISTRY
from epp.config.sections.plugins import ConfigReader, Declared, build_default, plugin_of_kind
from epp.config.sections.profiles import SATURATION_FILTER
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
from epp.scheduling.detectors import MaxSaturationDetector
from epp.scheduling.saturation import SaturationThresholds

FAIRNESS_PLUGINS = {
    f"{policy.value}-fairness-policy": policy
    for policy in Fairness
    if policy is not Fairness.PROGRAM_AWARE
} | {"program-aware-fairness": Fairness.PROGRAM_AWARE}

ORDERING_PLUGINS = {f"{policy.value}-ordering-policy": policy for policy in Ordering}


@dataclass(slots=True, frozen=True)
class FlowPlugins:
    """The flow-control plugins a configuration names, as their factories
    made them (None: epp's gate, see `flowcontrol.config.GateConfig`)."""

    saturation_detector: Any = None
    usage_limit: Any = None
    eviction: tuple[Any, Any] | None = None
    """(filter, ordering) when `enableEviction` is set."""
    admitters: tuple[Any, ...] = ()


PRIORITY = Bounds(-(2**31))
BAND_FIELDS = frozenset(
    {
        "maxRequests",
        "maxBytes",
        "defaultRequestTTL",
        "ttl",
        "fairnessPolicyRef",
        "orderingPolicyRef",
    }
)


def _policy(
    reader: ConfigReader,
    fields: Mapping[str, Any],
    key: str,
    path: str,
    plugins: dict[str, Declared],
    known: Mapping[str, Any],
    what: str,
) -> Declared | None:
    """The policy `fields[key]` names when it is one of `known`: a declared
    plugin, a registered type or a plain policy name ("vtc") used with its
    defaults; None when absent or after reporting why not."""
    if key not in fields:
        return None
    where = f"{path}.{key}"
    ref = reader.string(fields[key], where)
    if ref is None:
        return None
    plugin = plugins.get(ref)
    for suffix in ("", "-fairness-policy", "-ordering-policy"):
        registered = REGISTRY.get(ref + suffix)
        if plugin is None and registered is not None and registered.supported:
            parameters = read_parameters(reader, registered.parameters, None, where)
            plugin = Declared(registered.name, registered.kind, parameters, None)
    if plugin is None:
        if ref not in reader.broken:
            reader.fail(where, f"no plugin named {ref!r} and no such policy")
        return None
    if plugin.type not in known:
        reader.fail(where, f"{plugin.type} is not {what}")
        return None
    return plugin


def _band(
    reader: ConfigReader,
    value: Any,
    path: str,
    template: BandConfig,
    plugins: dict[str, Declared],
    extra: frozenset[str],
) -> tuple[BandConfig, dict[str, Any]]:
    fields = reader.mapping(value, path, BAND_FIELDS | extra)
    band = replace(
        template,
        max_requests=reader.quantity(
            fields.get("maxRequests"), f"{path}.maxRequests", template.max_requests
        ),
        max_bytes=reader.size(fields.get("maxBytes"), f"{path}.maxBytes", template.max_bytes),
        ttl=_band_ttl(reader, fields, path, template.ttl),
    )
    fairness = _policy(
        reader, fields, "fairnessPolicyRef", path, plugins, FAIRNESS_PLUGINS, "a fairness policy"
    )
    if fairness is not None:
        band = replace(
            band,
            fairness=FAIRNESS_PLUGINS[fairness.type],
            input_weight=fairness.parameters.get("inputTokenWeight", band.input_weight),
            output_weight=fairness.parameters.get("outputTokenWeight", band.output_weight),
        )
        if band.fairness is Fairness.PROGRAM_AWARE:
            band = replace(band, program_aware=_program_aware(fairness.parameters))
    ordering = _policy(
        reader, fields, "orderingPolicyRef", path, plugins, ORDERING_PLUGINS, "an ordering policy"
    )
    if ordering is not None:
        band = replace(band, ordering=ORDERING_PLUGINS[ordering.type])
    return band, fields


def _band_ttl(
    reader: ConfigReader, fields: Mapping[str, Any], path: str, inherited: float | None
) -> float | None:
    """A band's queue TTL: the reference's per-band `defaultRequestTTL`
    (llm-d-router PR #2649), or epp's earlier name `ttl`; the smallest of the
    global, band and request TTLs applies (`flowcontrol.config.effective_ttl`).
    `0s` or unset: the band adds none of its own."""
    if "defaultRequestTTL" in fields and "ttl" in fields:
        reader.fail(f"{path}.ttl", "give defaultRequestTTL or ttl, not both")
    key = "defaultRequestTTL" if "defaultRequestTTL" in fields else "ttl"
    return reader.duration(fields.get(key), f"{path}.{key}", inherited) or None


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


def _gate(reader: ConfigReader, value: Any) -> GateConfig:
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
        prefill_timeout=reader.duration(
            fields.get("prefillTimeout"),
            "flowControl.gate.prefillTimeout",
            defaults.prefill_timeout,
            POSITIVE,
        ),
    )


GATE_THRESHOLDS = {
    "queueDepthThreshold": "queue_depth",
    "kvCacheUtilThreshold": "kv_cache",
    "metricsStalenessThreshold": "staleness",
}
"""The gate's former copies of the saturation thresholds, by the field of
`SaturationThresholds` each one names."""


def read_gate_thresholds(reader: ConfigReader, flow: Any, saturation: SaturationThresholds) -> None:
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
        "bandSelectionPolicyPluginRef",
    }
)

EVICTION_PLUGINS = ("sheddable-eviction-filter", "priority-then-time-eviction-order-policy")
"""What `enableEviction` turns on, as in the reference."""


def read_flow_control(
    reader: ConfigReader,
    value: Any,
    plugins: dict[str, Declared],
    template: BandConfig,
    flow_plugins: FlowPlugins,
) -> FlowControlConfig:
    """The section's settings; a saturation detector replaces the adaptive
    gate (with the reference's default ceiling, static 1.0, unless a
    usage-limit policy is named), else the adaptive gate applies the
    usage-limit policy to each endpoint's learned limit."""
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
        priority = reader.integer(band_fields["priority"], f"{path}.priority", 0, PRIORITY)
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
    gate = _gate(reader, fields.get("gate"))
    if flow_plugins.saturation_detector is not None:
        gate = replace(
            gate,
            detector=flow_plugins.saturation_detector,
            usage_limits=flow_plugins.usage_limit or StaticUsageLimit(),
        )
    elif flow_plugins.usage_limit is not None:
        gate = replace(gate, usage_limits=flow_plugins.usage_limit)
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
        gate=gate,
        no_endpoint_ttl=no_endpoint_ttl,
    )


def _resolved(
    reader: ConfigReader,
    detector: Any,
    declared: Declared | None,
    plugins: dict[str, Declared],
    outer: frozenset[str],
) -> Any:
    """`detector` with a max-saturation-detector's children resolved to the
    detectors they name (None after reporting a bad child)."""
    if not isinstance(detector, MaxDetectorRefs):
        return detector
    path = f"{declared.path}.parameters.detectors" if declared else "flowControl.saturationDetector"
    children = []
    for index, name in enumerate(detector.detectors):
        where = f"{path}[{index}]"
        if name in outer:
            reader.fail(where, f"{name!r} contains itself")
            return None
        child = plugin_of_kind(reader, name, where, plugins, Kind.SATURATION_DETECTOR)
        child = _resolved(reader, child, plugins.get(name), plugins, outer | {name})
        if child is None:
            return None
        children.append(child)
    stages = tuple(detector.stages.get(name, frozenset()) for name in detector.detectors)
    return MaxSaturationDetector(tuple(children), stages)


def read_flow_plugins(
    reader: ConfigReader, value: Any, legacy_detector: Any, plugins: dict[str, Declared]
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
            detector = plugin_of_kind(
                reader, ref, f"{where}.pluginRef", plugins, Kind.SATURATION_DETECTOR
            )
            detector = _resolved(reader, detector, plugins.get(ref), plugins, frozenset({ref}))
    if fields.get("bandSelectionPolicyPluginRef"):
        # strict-band-selection-policy, the only one, is how the core always offers bands.
        plugin_of_kind(
            reader,
            fields["bandSelectionPolicyPluginRef"],
            "flowControl.bandSelectionPolicyPluginRef",
            plugins,
            Kind.BAND_SELECTION,
        )
    usage_limit = None
    if fields.get("usageLimitPolicyPluginRef"):
        usage_limit = plugin_of_kind(
            reader,
            fields["usageLimitPolicyPluginRef"],
            "flowControl.usageLimitPolicyPluginRef",
            plugins,
            Kind.USAGE_LIMIT,
        )
    eviction = None
    if reader.boolean(fields.get("enableEviction"), "flowControl.enableEviction", False):
        built = [
            build_default(reader, name, "flowControl.enableEviction") for name in EVICTION_PLUGINS
        ]
        if all(plugin is not None for plugin in built):
            eviction = (built[0].value, built[1].value)  # type: ignore[union-attr]
    admitters = tuple(p.value for p in plugins.values() if p.kind is Kind.ADMITTER)
    return FlowPlugins(detector, usage_limit, eviction, admitters)
