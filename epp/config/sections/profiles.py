"""The `schedulingProfiles` section and the scheduling settings that live
in plugin parameters: the profiles (filled in as the reference fills them),
the one profile handler and its deciders, the prefix index from the
approx-prefix-cache-producer, the saturation filter's thresholds, and the
checks that span plugins (deprecated headers handlers, session sources).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from epp.config.catalog.flowcontrol import MaxDetectorRefs
from epp.config.plugin import Kind
from epp.config.sections.plugins import ConfigReader, Declared, declared
from epp.scheduling.config import (
    MAX_SCORE_PICKER,
    SINGLE_PROFILE_HANDLER,
    ProfileConfig,
    SchedulingConfig,
    ScorerConfig,
)
from epp.scheduling.detectors import detector_filter
from epp.scheduling.profiles import disagg_profile_handler, header_profile_handler
from epp.scheduling.saturation import SaturationThresholds
from epp.scheduling.sessions import SESSION_ID_DATA_KEY, attribute_key
from epp.scheduling.spec import PluginSpec

SATURATION_FILTER = "saturation-filter"

PREFIX_PRODUCER = "approx-prefix-cache-producer"

_IN_PROFILES = (Kind.FILTER, Kind.SCORER, Kind.PICKER)


def _profile(
    reader: ConfigReader,
    value: Any,
    path: str,
    plugins: dict[str, Declared],
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
        elif plugin.kind is Kind.SATURATION_DETECTOR:
            if isinstance(plugin.value, MaxDetectorRefs):
                reader.fail(
                    f"{where}.pluginRef",
                    f"{plugin.type} has no filter role (nor has the reference's); "
                    "list its detectors in the profile",
                )
            else:
                # The reference's detectors are scheduling filters as well.
                filters.append(
                    PluginSpec(ref, detector_filter, (("detector", plugin.value),), plugin.type)
                )
        elif plugin.kind is not Kind.PROFILE_HANDLER:
            reader.fail(
                f"{where}.pluginRef", f"{plugin.type} ({plugin.kind}) does not belong in a profile"
            )
    if name is None:
        return None
    return ProfileConfig(name, tuple(filters), tuple(scorers), picker or default_picker)


def _profiles(
    reader: ConfigReader, value: Any, plugins: dict[str, Declared]
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
    reader: ConfigReader, plugins: dict[str, Declared], profiles: tuple[ProfileConfig, ...]
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


def _prefix_blocks(
    producer: Declared, defaults: SchedulingConfig
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


def read_scheduling(
    reader: ConfigReader, value: Any, plugins: dict[str, Declared]
) -> SchedulingConfig:
    """Profiles and handler (defaults without any); the prefix index from
    the declared approx-prefix-cache-producer; the saturation filter's
    thresholds."""
    defaults = SchedulingConfig()
    profiles = _profiles(reader, value, plugins) or defaults.profiles
    handler = _handler(reader, plugins, profiles)
    block_chars, max_blocks, lru_capacity, auto_tune, max_tokens = _prefix_blocks(
        declared(reader, plugins, PREFIX_PRODUCER), defaults
    )
    saturation_filter = declared(reader, plugins, SATURATION_FILTER)
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
        prefix_producer=next(
            (name for name, p in plugins.items() if p.type == PREFIX_PRODUCER), PREFIX_PRODUCER
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
    reader: ConfigReader, plugins: dict[str, Declared], handler: PluginSpec
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


def _check_session_sources(reader: ConfigReader, plugins: dict[str, Declared]) -> None:
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
