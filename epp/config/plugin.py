"""What a plugin type is: its name, kind, one-line summary, parameter schema
and factory. The catalogue of every type lives in `epp.config.catalog`; the
registry (`epp.config.registry`) is the one list that loading, `epp
validate`, `epp plugins` and the docs' plugin catalogue read.

A factory takes the plugin's parameters, already checked against the schema
with defaults filled in, and returns the configured plugin as a frozen value
(the loader places it by kind: into a profile, a band, the gate, ...). A
factory may raise `ParameterError` for a rule the schema cannot state, or
`Unsupported` when the type cannot run here; so does every type registered
with a `refusal` instead of a factory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from epp.config.fieldreader import Bounds, FieldReader


class Kind(StrEnum):
    """Where a plugin type plugs in."""

    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    PROFILE_HANDLER = "profile-handler"
    DECIDER = "decider"
    PRODUCER = "producer"
    DATA_SOURCE = "data-source"
    EXTRACTOR = "extractor"
    DISCOVERY = "discovery"
    PARSER = "parser"
    FAIRNESS = "fairness"
    ORDERING = "ordering"
    SATURATION_DETECTOR = "saturation-detector"
    USAGE_LIMIT = "usage-limit-policy"
    BAND_SELECTION = "band-selection-policy"
    ADMITTER = "admitter"
    EVICTION_FILTER = "eviction-filter"
    EVICTION_ORDERING = "eviction-ordering"
    REQUEST_CONTROL = "request-control"


class Stability(StrEnum):
    """The reference's stability level; alpha types need
    `--allow-experimental-plugins` there."""

    ALPHA = "alpha"
    BETA = "beta"


class ParamType(StrEnum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STRING = "string"
    DURATION = "duration"
    """A Go duration string; read as seconds."""
    BYTES = "bytes"
    STRINGS = "[]string"
    STRING_MAP = "map[string]string"
    OBJECT = "object"
    """A mapping with its own schema (`fields`)."""
    LIST = "list"
    """A list of mappings, each with the schema `fields`."""
    ANY = "any"
    """Free-form; the factory checks it."""


@dataclass(slots=True, frozen=True)
class Param:
    """One parameter: its reference name, type and default (None = unset).
    Bounds are inclusive unless `exclusive` is set."""

    name: str
    type: ParamType
    default: Any = None
    summary: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False
    fields: tuple[Param, ...] = ()
    nullable: bool = False
    """An object that stays None when absent (else its fields' defaults)."""


Parameters = Mapping[str, Any]
Factory = Callable[[Parameters], Any]


class ParameterError(ValueError):
    """A parameter breaks a rule of its plugin; `field` names it ("" = the whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Unsupported(ValueError):
    """The plugin type cannot run in epp; the message says why."""

    def __init__(self, plugin_type: str, reason: str) -> None:
        super().__init__(f"plugin type {plugin_type!r} is not supported by epp: {reason}")
        self.plugin_type = plugin_type
        self.reason = reason


@dataclass(slots=True, frozen=True)
class PluginType:
    """One entry of the registry. Exactly one of `factory` and `refusal`."""

    name: str
    kind: Kind
    summary: str
    parameters: tuple[Param, ...] = ()
    factory: Factory | None = None
    refusal: str | None = None
    stability: Stability = Stability.BETA
    deprecated_for: str | None = None
    """The type that replaces this deprecated one, if any."""
    source: str | None = None
    """Where the reference added the type after the 2026-08-22 snapshot the
    rest of the catalogue follows (a merged PR, or the file it was seen in)."""

    def __post_init__(self) -> None:
        if (self.factory is None) == (self.refusal is None):
            raise ValueError(f"{self.name}: give exactly one of factory and refusal")

    @property
    def supported(self) -> bool:
        """Whether a config may declare it (refused and pending types may not)."""
        return self.factory is not None and not isinstance(self.factory, Pending)

    @property
    def reason(self) -> str | None:
        """Why it is not supported, or None."""
        if isinstance(self.factory, Pending):
            return f"not implemented yet ({self.factory.issue})"
        return self.refusal

    def build(self, parameters: Parameters) -> Any:
        """The configured plugin; Unsupported or ParameterError otherwise."""
        if self.factory is None:
            raise Unsupported(self.name, self.refusal or "")
        built = self.factory(parameters)
        if isinstance(built, Configured) and not built.type:
            return replace(built, type=self.name)
        return built


def read_parameters(
    reader: FieldReader, schema: tuple[Param, ...], value: Any, path: str
) -> dict[str, Any]:
    """The parameters of `schema` from `value`, defaults filled in; every
    problem goes to `reader` with its path. Unknown keys are errors."""
    fields = reader.mapping(value, path, {param.name for param in schema})
    result: dict[str, Any] = {}
    for param in schema:
        where = f"{path}.{param.name}"
        raw = fields.get(param.name)
        if raw is None:
            if param.required:
                reader.fail(where, "required")
            result[param.name] = _default(param)
            continue
        result[param.name] = _read(reader, param, raw, where)
    return result


def _default(param: Param) -> Any:
    if (
        param.type is ParamType.OBJECT
        and param.default is None
        and param.fields
        and not param.nullable
    ):
        return {field.name: _default(field) for field in param.fields}
    return param.default


def _read(reader: FieldReader, param: Param, raw: Any, where: str) -> Any:
    kind = param.type
    bounds = Bounds(param.minimum, param.maximum, param.exclusive)
    if kind is ParamType.BOOL:
        return reader.boolean(raw, where, param.default)
    if kind is ParamType.INT:
        return reader.integer(raw, where, param.default, bounds)
    if kind is ParamType.FLOAT:
        return reader.number(raw, where, param.default, bounds)
    if kind is ParamType.STRING:
        return reader.string(raw, where, param.default, empty=True, choices=param.choices)
    if kind is ParamType.DURATION:
        return reader.duration(raw, where, param.default, bounds)
    if kind is ParamType.BYTES:
        return reader.size(raw, where, param.default)
    if kind is ParamType.STRINGS:
        if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
            reader.fail(where, f"must be a list of strings, got {raw!r}")
            return param.default
        return tuple(raw)
    if kind is ParamType.STRING_MAP:
        if not isinstance(raw, Mapping) or not all(
            isinstance(key, str) and isinstance(item, str) for key, item in raw.items()
        ):
            reader.fail(where, f"must be a mapping of strings to strings, got {raw!r}")
            return param.default
        return dict(raw)
    if kind is ParamType.OBJECT:
        if not param.fields:
            return raw
        return read_parameters(reader, param.fields, raw, where)
    if kind is ParamType.LIST:
        return tuple(
            read_parameters(reader, param.fields, item, f"{where}[{index}]")
            if param.fields
            else item
            for index, item in enumerate(reader.sequence(raw, where))
        )
    return raw


@dataclass(slots=True, frozen=True)
class Configured:
    """A declared plugin: its type and its checked parameters (defaults
    filled in). What the factory of a type without a typed configuration of
    its own returns; the loader reads the parameters it needs."""

    type: str
    parameters: Mapping[str, Any]


NEEDS_LATENCY_PREDICTOR = (
    "needs the reference's latency-predictor sidecar (trained XGBoost models), "
    "which epp does not run"
)
"""The refusal of every plugin type that predicts latency with the reference's sidecar."""

MULTICLUSTER_UNSUPPORTED = "cluster-scoped (multi-cluster) EPPs are not supported"
"""The refusal of every plugin type that works across clusters."""


def configured(parameters: Parameters) -> Configured:
    """The factory of a type without a typed configuration of its own; the
    type's name is its entry's, which `PluginType.build` fills in."""
    return Configured("", dict(parameters))


@dataclass(slots=True, frozen=True)
class Pending:
    """The factory of a type whose behaviour another issue implements: it
    refuses at load, naming the issue, until that issue replaces it."""

    plugin_type: str
    issue: str

    def __call__(self, parameters: Parameters) -> Any:
        raise Unsupported(self.plugin_type, f"not implemented yet ({self.issue})")


def pending(plugin_type: str, issue: str) -> Factory:
    return Pending(plugin_type, issue)
