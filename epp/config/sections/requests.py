"""The `requestHandler` section (and the deprecated top-level `parser`):
which request parsers run, in order."""

from __future__ import annotations

from typing import Any

from epp.config.plugin import Kind
from epp.config.registry import REGISTRY
from epp.config.sections.plugins import ConfigReader, Declared, build_default
from epp.extproc.parsers import DEFAULT_PARSERS, Parser


def read_parsers(
    reader: ConfigReader, value: Any, legacy: Any, plugins: dict[str, Declared]
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
        if name is None or name in reader.broken:
            continue
        plugin = plugins.get(name)
        if plugin is None and name in REGISTRY:
            plugin = build_default(reader, name, f"{path}.pluginRef")
            if plugin is None:
                continue
        if plugin is None:
            reader.missing(f"{path}.pluginRef", name)
        elif plugin.kind is not Kind.PARSER:
            reader.fail(f"{path}.pluginRef", f"{plugin.type} is not a parser")
        else:
            found.append(plugin.value)
    return tuple(found)
