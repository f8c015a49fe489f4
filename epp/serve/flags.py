"""How a `ServeOptions` field becomes a flag: its group, the kind of value
it takes (the text's parser and how a default is shown), and the
`--grpc-*` flags that set `TransportLimits`, one per field. The table of
flags itself is `epp.serve.options`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from epp.api.units import format_duration, parse_byte_size, parse_duration
from epp.transport.limits import TransportLimits


class Group(Enum):
    """The reference runner's option groups, then ours."""

    EXT_PROC = "ext_proc"
    POOL = "InferencePool"
    ENDPOINTS = "endpoints (in lieu of an InferencePool)"
    SCRAPING = "model-server metrics scraping"
    DIAGNOSTICS = "diagnostics (logging, health, metrics, TLS)"
    CONFIGURATION = "configuration"
    EPP = "epp only (not flags of the reference EPP)"
    TRANSPORT = "ext_proc transport limits (epp only; see docs/operations/transport-limits.md)"


class Kind(Enum):
    """How a flag's text becomes a value, and how its default is shown."""

    INT = "int"
    BOOL = "bool"
    TEXT = "text"
    DURATION = "duration"
    SIZE = "size"
    INT_LIST = "int list"
    TEXT_LIST = "text list"
    PATHS = "paths"
    FLOAT = "float"


NOT_SET = object()
"""`Flag.inert_value` when every given value is warned about."""


@dataclass(slots=True, frozen=True)
class Flag:
    group: Group
    help: str
    kind: Kind
    names: tuple[str, ...] = ()
    """Option strings; default: the field's name as `--kebab-case`."""
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    no_effect: str | None = None
    """Why the flag changes nothing in epp; it is accepted and warned about."""
    inert_value: Any = NOT_SET
    """The value that asks for what epp does anyway (not warned about)."""
    default_text: str | None = None
    """The default as the help shows it, when the field's value alone would mislead."""


def option(default: Any, flag: Flag) -> Any:
    """A ServeOptions field that is also a flag."""
    if isinstance(default, list | dict | set):
        raise TypeError("use a tuple for a sequence default")
    return field(default=default, metadata={"flag": flag})


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "t", "true", "y", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "n", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}; use true or false")


def _checked(parse: Callable[[Any], Any]) -> Callable[[str], Any]:
    def parse_argument(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse_argument


def _size(text: str) -> int:
    """A byte quantity as the reference reads it (a trailing B is dropped:
    `10MiB`, `25MB`)."""
    stripped = text.strip()
    if len(stripped) > 1 and stripped[-1] in "Bb":
        stripped = stripped[:-1]
    return parse_byte_size(stripped)


def _int_list(text: str) -> tuple[int, ...]:
    values: list[int] = []
    for part in filter(None, (item.strip() for item in text.split(","))):
        value = int(part)
        if value not in values:
            values.append(value)
    return tuple(values)


def _text_list(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (item.strip() for item in text.split(","))))


METAVARS = {
    Kind.INT: "N",
    Kind.BOOL: "true|false",
    Kind.TEXT: "VALUE",
    Kind.DURATION: "DURATION",
    Kind.SIZE: "SIZE",
    Kind.INT_LIST: "N,...",
    Kind.TEXT_LIST: "NAME,...",
    Kind.PATHS: "PATH",
    Kind.FLOAT: "X",
}
PARSERS: dict[Kind, Callable[[str], Any]] = {
    Kind.INT: int,
    Kind.BOOL: _parse_bool,
    Kind.TEXT: str,
    Kind.DURATION: _checked(parse_duration),
    Kind.SIZE: _checked(_size),
    Kind.INT_LIST: _checked(_int_list),
    Kind.TEXT_LIST: _text_list,
    Kind.PATHS: str,
    Kind.FLOAT: float,
}


def format_size(size: int) -> str:
    """Bytes in the largest binary unit that writes them whole (as the flags take them)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def shown(value: Any, kind: Kind) -> str:
    """A value as the flag would be written."""
    if value is None or value == ():
        return "none"
    if kind is Kind.BOOL:
        return "true" if value else "false"
    if kind is Kind.DURATION:
        return format_duration(value)
    if kind is Kind.SIZE:
        return format_size(value)
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


TRANSPORT_SIZES = ("max_receive_message_bytes", "max_send_message_bytes")
"""TransportLimits fields set by the reference's --grpc-max-*-msg-size flags."""


def transport_flags() -> Iterator[tuple[str, Kind]]:
    """(TransportLimits field, kind) of each `--grpc-<field>` flag: sizes
    for `_bytes`, a number for `_ratio`, durations for the other floats."""
    for item in dataclasses.fields(TransportLimits):
        if item.name in TRANSPORT_SIZES:
            continue
        if item.name.endswith("_bytes"):
            yield item.name, Kind.SIZE
        elif item.name.endswith("_ratio"):
            yield item.name, Kind.FLOAT
        elif item.type in ("float", float):
            yield item.name, Kind.DURATION
        else:
            yield item.name, Kind.INT


def add_transport_arguments(group: argparse._ArgumentGroup) -> None:
    defaults = TransportLimits()
    for name, kind in transport_flags():
        group.add_argument(
            "--grpc-" + name.replace("_", "-"),
            dest="transport." + name,
            default=argparse.SUPPRESS,
            type=PARSERS[kind],
            metavar=METAVARS[kind],
            help=with_default(
                TransportLimits.description(name), shown(getattr(defaults, name), kind)
            ),
        )


def with_default(description: str, default: str) -> str:
    """A flag's help: its description, then its default unless it has none
    (the description then says what happens without it)."""
    text = description if default == "none" else f"{description} (default {default})"
    return text.replace("%", "%%")


def table_flags(table: type) -> Iterator[tuple[str, Flag]]:
    """(field name, flag) of every field of `table` that is a flag, in definition order."""
    for item in dataclasses.fields(table):
        if "flag" in item.metadata:
            yield item.name, item.metadata["flag"]


def flag_name(name: str, flag: Flag) -> str:
    return flag.names[0] if flag.names else "--" + name.replace("_", "-")


def add_table_arguments(parser: argparse.ArgumentParser, table: type) -> None:
    """One argument per flag of `table`, then the transport's; an option not
    given stays absent from the parsed namespace (so the options object
    keeps its default and knows which flags were given)."""
    groups = {group: parser.add_argument_group(group.value) for group in Group}
    defaults = table()
    for name, flag in table_flags(table):
        default = flag.default_text or shown(getattr(defaults, name), flag.kind)
        arguments: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": with_default(flag.help, default),
            "type": PARSERS[flag.kind],
            "metavar": flag.metavar or METAVARS[flag.kind],
        }
        if flag.no_effect is not None:
            arguments["help"] += f" [accepted; no effect in epp: {flag.no_effect}]"
        if flag.kind is Kind.BOOL:
            arguments.update(nargs="?", const=True)
        if flag.kind is Kind.PATHS:
            arguments["nargs"] = "+"
        if flag.choices is not None:
            arguments.update(choices=flag.choices, metavar="{" + ",".join(flag.choices) + "}")
        names = flag.names or (flag_name(name, flag),)
        groups[flag.group].add_argument(*names, **arguments)
    add_transport_arguments(groups[Group.TRANSPORT])


def given_values(args: argparse.Namespace, table: type) -> dict[str, Any]:
    """The fields of `table` given on the command line, by name (the
    transport's as one `TransportLimits` in `transport`)."""
    kinds = {name: flag.kind for name, flag in table_flags(table)}
    given = {name: value for name, value in vars(args).items() if name in kinds}
    for name, value in given.items():
        if kinds[name] is Kind.PATHS:
            given[name] = tuple(value)
    limits = {
        name: value
        for key, value in vars(args).items()
        if key.startswith("transport.") and (name := key.removeprefix("transport."))
    }
    if limits:
        given["transport"] = TransportLimits(**limits)
    return given
