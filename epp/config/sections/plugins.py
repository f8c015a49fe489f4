"""The `plugins` section: every declared plugin built by its type's factory,
and the lookups the other sections resolve their `pluginRef`s with.

`ConfigReader` is the field reader of the whole file: it also gathers the
warnings and remembers the declared plugins it could not build, so a
reference to one is not reported a second time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from epp.config.fieldreader import FieldReader
from epp.config.plugin import Configured, Kind, ParameterError, Unsupported, read_parameters
from epp.config.registry import REGISTRY
from epp.scheduling.spec import PluginSpec, named


class ConfigReader(FieldReader):
    """Reads typed values and collects every error with its path."""

    def __init__(self) -> None:
        super().__init__()
        self.unsupported = False
        self.warnings: list[str] = []
        self.broken: set[str] = set()
        """Names of declared plugins that were not built (an unknown or
        unsupported type, bad parameters): their declaration's error says
        why, so a reference to one is not reported a second time."""

    def missing(self, path: str, name: str) -> None:
        """A reference to an undeclared plugin (quiet when it is broken)."""
        if name not in self.broken:
            self.fail(path, f"no plugin named {name!r} in plugins")

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}" if path else message)


@dataclass(slots=True, frozen=True)
class Declared:
    """A declared plugin (or a registered type used with its defaults)."""

    type: str
    kind: Kind
    parameters: Mapping[str, Any]
    """The checked parameters, defaults filled in."""
    value: Any
    """What the type's factory made of them."""
    path: str = ""
    """Where the plugin was declared, for errors in its parameters."""


def read_plugins(reader: ConfigReader, value: Any) -> dict[str, Declared]:
    plugins: dict[str, Declared] = {}
    for index, entry in enumerate(reader.sequence(value, "plugins")):
        path = f"plugins[{index}]"
        fields = reader.mapping(entry, path, {"type", "name", "parameters"})
        plugin_type = reader.string(fields.get("type"), f"{path}.type")
        if plugin_type is None:
            continue
        registered = REGISTRY.get(plugin_type)
        if registered is None or registered.reason is not None:
            if registered is None:
                reader.fail(
                    f"{path}.type",
                    f"unknown plugin type {plugin_type!r}; `epp plugins` lists the known ones",
                )
            else:
                reader.unsupported = True
                reader.fail(f"{path}.type", str(Unsupported(plugin_type, registered.reason)))
            name = fields.get("name", plugin_type)
            reader.broken.add(name if isinstance(name, str) else plugin_type)
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
            reader.broken.add(name)
            continue
        try:
            built = registered.build(parameters)
        except Unsupported as refusal:
            reader.unsupported = True
            reader.fail(f"{path}.type", str(refusal))
            reader.broken.add(name)
            continue
        except ParameterError as error:
            reader.fail(f"{where}.{error.field}" if error.field else where, str(error))
            reader.broken.add(name)
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
        plugins[name] = Declared(plugin_type, registered.kind, parameters, built, path)
    return plugins


def plugin_of_kind(
    reader: ConfigReader, ref: Any, path: str, plugins: dict[str, Declared], kind: Kind
) -> Any:
    """What the factory made of the plugin `ref` names (a declared plugin,
    or a registered type used with its defaults, as the reference allows for
    its default plugins); None after reporting why it cannot be used."""
    name = reader.string(ref, path)
    if name is None or name in reader.broken:
        return None
    plugin = plugins.get(name)
    if plugin is None:
        registered = REGISTRY.get(name)
        if registered is None:
            reader.missing(path, name)
            return None
        plugin = build_default(reader, registered.name, path)
        if plugin is None:
            return None
    if plugin.kind is not kind:
        reader.fail(path, f"{name!r} is a {plugin.type} ({plugin.kind}), not a {kind}")
        return None
    return plugin.value


def build_default(reader: ConfigReader, plugin_type: str, path: str) -> Declared | None:
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
    return Declared(plugin_type, registered.kind, parameters, value, path)


def referenced(
    reader: ConfigReader, ref: Any, path: str, plugins: dict[str, Declared]
) -> Declared | None:
    name = reader.string(ref, path)
    if name is None:
        return None
    plugin = plugins.get(name)
    if plugin is None:
        reader.missing(path, name)
    return plugin


def declared(reader: ConfigReader, plugins: dict[str, Declared], plugin_type: str) -> Declared:
    """The first declared plugin of `plugin_type`, or one with its defaults."""
    for plugin in plugins.values():
        if plugin.type == plugin_type:
            return plugin
    registered = REGISTRY.get(plugin_type)
    assert registered is not None, plugin_type
    parameters = read_parameters(reader, registered.parameters, None, "plugins")
    return Declared(plugin_type, registered.kind, parameters, Configured(plugin_type, parameters))
