"""The plugin registry: every plugin type epp knows, by name. The one list
of plugin names; config loading, `epp validate`, `epp plugins` and the
the docs' plugin catalogue (`epp.cli.docgen`) all read it.

A type is either supported (it has a factory) or refused (its entry says
why, and loading a config that declares it fails naming the type and the
reason). Unknown types are errors too, naming the known ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from epp.api.units import format_duration
from epp.config.catalog import datalayer, flowcontrol, profiles, requests, scheduling
from epp.config.plugin import Kind, Param, ParamType, PluginType


class Registry:
    """Plugin types by name, in catalogue order."""

    __slots__ = ("_types",)

    def __init__(self, entries: tuple[PluginType, ...]) -> None:
        self._types: dict[str, PluginType] = {}
        for entry in entries:
            if entry.name in self._types:
                raise ValueError(f"plugin type {entry.name!r} registered twice")
            self._types[entry.name] = entry

    def get(self, name: str) -> PluginType | None:
        return self._types.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[PluginType]:
        return iter(self._types.values())

    def __len__(self) -> int:
        return len(self._types)

    def of_kind(self, kind: Kind) -> list[PluginType]:
        return [entry for entry in self._types.values() if entry.kind is kind]

    def replace(self, entry: PluginType) -> PluginType:
        """Swap in a new entry for a registered type (tests; an issue that
        implements a pending type edits its catalogue entry instead)."""
        previous = self._types[entry.name]
        self._types[entry.name] = entry
        return previous


REGISTRY = Registry(
    scheduling.ENTRIES
    + profiles.ENTRIES
    + flowcontrol.ENTRIES
    + requests.ENTRIES
    + datalayer.ENTRIES
)


def describe(entry: PluginType) -> dict[str, Any]:
    """One type as plain data (for `epp plugins --json`)."""
    return {
        "type": entry.name,
        "kind": entry.kind.value,
        "summary": entry.summary,
        "supported": entry.supported,
        "reason": entry.reason,
        "stability": entry.stability.value,
        "deprecatedFor": entry.deprecated_for,
        "source": entry.source,
        "parameters": [_describe_param(param) for param in entry.parameters],
    }


def _describe_param(param: Param) -> dict[str, Any]:
    described: dict[str, Any] = {
        "name": param.name,
        "type": param.type.value,
        "default": written(param.default, param.type),
    }
    if param.summary:
        described["summary"] = param.summary
    if param.required:
        described["required"] = True
    if param.choices:
        described["choices"] = list(param.choices)
    if param.minimum is not None:
        described["minimum"] = param.minimum
        if param.exclusive:
            described["exclusiveMinimum"] = True
    if param.maximum is not None:
        described["maximum"] = param.maximum
    if param.fields:
        described["fields"] = [_describe_param(field) for field in param.fields]
    return described


def written(value: Any, kind: ParamType) -> Any:
    """A parameter's value as a configuration writes it: a duration as a Go
    duration string ("200ms"), a tuple as a list, the rest as it is."""
    if kind is ParamType.DURATION and isinstance(value, int | float):
        return format_duration(value)
    if isinstance(value, tuple):
        return [written(item, kind) for item in value]
    return value


def markdown_table(registry: Registry = REGISTRY) -> str:
    """The docs' plugin catalogue: one row per type, by kind."""
    lines = [
        "| type | kind | stability | what it does | parameters (default) |",
        "|---|---|---|---|---|",
    ]
    for kind in Kind:
        for entry in registry.of_kind(kind):
            parameters = ", ".join(
                f"`{param.name}`"
                + ("" if param.default in (None, "", ()) else f" ({_show(param)})")
                for param in entry.parameters
            )
            summary = entry.summary
            if entry.reason is not None:
                summary = f"**not supported**: {entry.reason}"
            elif entry.deprecated_for:
                summary += f" (deprecated, use `{entry.deprecated_for}`)"
            if entry.source:
                summary += f" (newer than the 2026-08 catalogue: {entry.source})"
            lines.append(
                f"| `{entry.name}` | {kind.value} | {entry.stability.value} | {summary} "
                f"| {parameters} |"
            )
    return "\n".join(lines)


def _show(param: Param) -> str:
    value = param.default
    if isinstance(value, bool):
        return "true" if value else "false"
    if param.type is ParamType.DURATION:
        return written(value, param.type)
    if isinstance(value, tuple | dict):
        return "see README of the reference"
    return str(value)


if __name__ == "__main__":
    print(markdown_table())
