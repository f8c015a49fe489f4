"""A structural OpenAPI v3 schema walker that does what the API server does
with a custom resource: drop nulls, apply defaults, prune (or, strictly,
reject) unknown fields, validate, then evaluate the CEL rules.

One walk does all of it because the steps depend on each other: defaults fill
in before `required` and the CEL rules look at the value; pruning decides what
`self` contains. Error texts follow the API server's (`field.Error`), so the
message a user sees here is the one `kubectl apply` would show.

Supported: type (object, array, string, integer, number, boolean), format
int32/int64/date-time, minimum/maximum (and exclusive), minLength/maxLength,
pattern, enum, required, minProperties/maxProperties, minItems/maxItems,
properties/additionalProperties, default, nullable,
x-kubernetes-preserve-unknown-fields, x-kubernetes-list-type map (unique
list-map-keys) and set, x-kubernetes-validations (rule, message,
messageExpression, fieldPath).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from epp.api.cel import RuleError, evaluate, holds

INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


@dataclass(slots=True, frozen=True)
class FieldError:
    """One problem at one field, rendered as `path: type: value: detail`."""

    path: str
    type: str
    value: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        parts = [self.path or "<root>", self.type]
        if self.value is not None:
            parts.append(self.value)
        if self.detail:
            parts.append(self.detail)
        return ": ".join(parts)


def render(value: Any) -> str:
    """A value as the API server prints it in an error."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, sort_keys=True)


TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)
"""JSON Schema's name of each Python type a parsed document holds."""


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return next(
        (name for kind, name in TYPE_NAMES if isinstance(value, kind)), type(value).__name__
    )


def _has_type(value: Any, expected: str) -> bool:
    match expected:
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "boolean":
            return isinstance(value, bool)
    return True


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _is_date_time(text: str) -> bool:
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in text.upper()


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Walk:
    """One validation of one value against one schema."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.errors: list[FieldError] = []
        self.rule_errors: list[FieldError] = []

    def error(self, path: str, kind: str, value: str | None = None, detail: str = "") -> None:
        self.errors.append(FieldError(path, kind, value, detail))

    def node(self, value: Any, schema: dict[str, Any], path: str) -> Any:
        """Validate `value` at `path`; returns it defaulted and pruned."""
        expected = schema.get("type")
        if expected and not _has_type(value, expected):
            self.error(
                path,
                "Invalid value",
                render(type_name(value)),
                f"{path} in body must be of type {expected}: {render(type_name(value))}",
            )
            return value
        if isinstance(value, dict) and expected == "object":
            value = self._object(value, schema, path)
        elif isinstance(value, list):
            value = self._array(value, schema, path)
        elif isinstance(value, str):
            self._string(value, schema, path)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self._number(value, schema, path)
        if "enum" in schema and value not in schema["enum"]:
            supported = ", ".join(render(option) for option in schema["enum"])
            self.error(path, "Unsupported value", render(value), f"supported values: {supported}")
        self._rules(value, schema, path)
        return value

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: str) -> dict[str, Any]:
        properties: dict[str, Any] = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        result: dict[str, Any] = {}
        for key, child in value.items():
            child_schema = properties.get(key)
            if child_schema is None and isinstance(additional, dict):
                child_schema = additional
            if child_schema is None:
                if preserve or additional is True:
                    result[key] = child
                elif self.strict:
                    self.error(
                        _child(path, key), "Unknown field", None, "field not declared in schema"
                    )
                continue
            if child is None and not child_schema.get("nullable", False):
                continue
            result[key] = child
        for key, child_schema in properties.items():
            if key not in result and "default" in child_schema:
                result[key] = copy.deepcopy(child_schema["default"])
        for key in list(result):
            child_schema = properties.get(key) or (
                additional if isinstance(additional, dict) else None
            )
            if child_schema is not None:
                result[key] = self.node(result[key], child_schema, _child(path, key))
        for key in schema.get("required", ()):
            if key not in result:
                self.error(_child(path, key), "Required value")
        count = len(result)
        if "minProperties" in schema and count < schema["minProperties"]:
            self.error(
                path,
                "Invalid value",
                render(count),
                f"{path} in body should have at least {schema['minProperties']} properties",
            )
        if "maxProperties" in schema and count > schema["maxProperties"]:
            self.error(
                path,
                "Too many",
                render(count),
                f"must have at most {schema['maxProperties']} items",
            )
        return result

    def _array(self, value: list[Any], schema: dict[str, Any], path: str) -> list[Any]:
        items = schema.get("items")
        if items is not None:
            value = [self.node(item, items, f"{path}[{index}]") for index, item in enumerate(value)]
        if "minItems" in schema and len(value) < schema["minItems"]:
            self.error(
                path,
                "Invalid value",
                render(len(value)),
                f"{path} in body should have at least {schema['minItems']} items",
            )
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.error(
                path,
                "Too many",
                render(len(value)),
                f"must have at most {schema['maxItems']} items",
            )
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys", ())
            self._unique(value, path, lambda item: tuple(_get(item, key) for key in keys), keys)
        elif list_type == "set":
            self._unique(value, path, lambda item: json.dumps(item, sort_keys=True), None)
        return value

    def _unique(self, value: list[Any], path: str, key_of: Any, keys: Any) -> None:
        seen: set[Any] = set()
        for index, item in enumerate(value):
            key = key_of(item)
            if key in seen:
                shown = {k: _get(item, k) for k in keys} if keys else item
                self.error(f"{path}[{index}]", "Duplicate value", render(shown))
            seen.add(key)

    def _string(self, value: str, schema: dict[str, Any], path: str) -> None:
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            self.error(path, "Too long", None, f"may not be more than {schema['maxLength']} bytes")
        if "minLength" in schema and len(value) < schema["minLength"]:
            self.error(
                path,
                "Invalid value",
                render(value),
                f"{path} in body should be at least {schema['minLength']} chars long",
            )
        pattern = schema.get("pattern")
        if pattern is not None and not _regex(pattern).search(value):
            self.error(
                path, "Invalid value", render(value), f"{path} in body should match '{pattern}'"
            )
        if schema.get("format") == "date-time" and not _is_date_time(value):
            self.error(
                path,
                "Invalid value",
                render(value),
                f"{path} in body must be of type date-time: {render(value)}",
            )

    def _number(self, value: float, schema: dict[str, Any], path: str) -> None:
        bounds = INT_RANGES.get(schema.get("format", ""))
        if bounds and not bounds[0] <= value <= bounds[1]:
            self.error(
                path,
                "Invalid value",
                render(value),
                f'{path} in body must be of type {schema["format"]}: "{value}"',
            )
            return
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                than = (
                    "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                )
                self.error(
                    path, "Invalid value", render(value), f"{path} in body should be {than} {low}"
                )
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                than = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                self.error(
                    path, "Invalid value", render(value), f"{path} in body should be {than} {high}"
                )

    def _rules(self, value: Any, schema: dict[str, Any], path: str) -> None:
        for rule in schema.get("x-kubernetes-validations", ()):
            rule_path = path + rule.get("fieldPath", "")
            shown = render(type_name(value))
            try:
                if holds(rule["rule"], value):
                    continue
                message = rule.get("message") or f"failed rule: {rule['rule']}"
                if "messageExpression" in rule:
                    message = str(evaluate(rule["messageExpression"], value))
            except RuleError as error:
                self.rule_errors.append(
                    FieldError(rule_path, "Invalid value", shown, f"rule evaluation error: {error}")
                )
                continue
            self.rule_errors.append(FieldError(rule_path, "Invalid value", shown, message))


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else None


def validate(
    value: Any, schema: dict[str, Any], path: str = "", strict: bool = True
) -> tuple[Any, list[FieldError]]:
    """`value` defaulted and pruned, and every error, schema errors first.

    With `strict`, an unknown field is an error (as `kubectl apply` with its
    default strict field validation); without, it is silently pruned (as the
    API server does for clients that do not ask for validation).
    """
    walk = Walk(strict)
    result = walk.node(copy.deepcopy(value), schema, path)
    return result, walk.errors + walk.rule_errors
