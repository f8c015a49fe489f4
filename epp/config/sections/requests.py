"""The `requestHandler` section (and the deprecated top-level `parser`):
which request parsers run, in order, and whether the objective's priority
goes into the forwarded body (`propagatePriority`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.config.datalayer import ModelsSourceSettings
from epp.config.plugin import Kind
from epp.config.registry import REGISTRY
from epp.config.sections.plugins import ConfigReader, Declared, build_default
from epp.extproc.parsers import DEFAULT_PARSERS, Parser


def read_parsers(
    reader: ConfigReader, value: Any, legacy: Any, plugins: dict[str, Declared]
) -> tuple[Parser, ...]:
    """Parser types in order: `requestHandler.parsers`, else the deprecated
    top-level `parser`, else the reference's four."""
    fields = reader.mapping(value, "requestHandler", {"parsers", "propagatePriority"})
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


def read_propagate_priority(reader: ConfigReader, value: Any) -> bool:
    """`requestHandler.propagatePriority`: off unless set, as in the reference
    (llm-d-router PR #2265)."""
    fields = value if isinstance(value, Mapping) else {}
    return reader.boolean(
        fields.get("propagatePriority"), "requestHandler.propagatePriority", False
    )


def read_models(reader: ConfigReader, plugins: dict[str, Declared]) -> ModelsSourceSettings | None:
    """How the pods' model lists are read when `models-responder` is declared:
    the declared `models-data-source`, else one with its defaults, as the
    reference creates it; None without the responder."""
    types = {plugin.type: plugin for plugin in plugins.values()}
    if "models-responder" not in types:
        if "models-data-source" in types:
            reader.warn(
                types["models-data-source"].path,
                "nothing reads the model lists without models-responder: not polled",
            )
        return None
    reader.warn(
        types["models-responder"].path,
        "epp's models-responder answers GET /v1/models; unlike the reference's, it does "
        "not narrow an inference request's candidates to the pods that list its model",
    )
    source = types.get("models-data-source")
    return source.value if source is not None else ModelsSourceSettings()
