"""Reading a parsed YAML document field by field, collecting every error
with its path ("flowControl.gate.kinds[1]: ...") instead of stopping at the
first. The one typed reader: the EPP configuration, the plugin parameters
(`epp.config.plugin`) and the simulator's scenarios all read through it, so
the same mistake reads the same in each file.

Every typed read takes the raw value (None when the key is absent), its
path and a default: the value returned when the key is absent and when it
is bad (after the error is recorded). A `REQUIRED` default makes a missing
key an error; a required value that is missing or bad then reads as a
placeholder (1, 1.0, None) so reading can go on to find the other errors;
the caller raises before anything uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from epp.api.units import parse_byte_size, parse_duration


class _Required(Enum):
    REQUIRED = "required"


REQUIRED = _Required.REQUIRED
"""The default of a field that must be given."""


@dataclass(slots=True, frozen=True)
class Bounds:
    """An inclusive range (`exclusive`: the minimum is excluded); None is unbounded."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False

    def hold(self, value: float) -> bool:
        low, high = self.minimum, self.maximum
        too_low = low is not None and (value <= low if self.exclusive else value < low)
        return not too_low and not (high is not None and value > high)

    def words(self, unit: str = "") -> str:
        """How the range reads in an error (">= 0", "in (0, 1]"); with a
        `unit` the bounds are written as durations are ("0s", "1.5s")."""
        low, high = (
            (self.minimum, self.maximum)
            if not unit
            else tuple(None if b is None else f"{b:g}{unit}" for b in (self.minimum, self.maximum))
        )
        if high is None:
            return f"> {low}" if self.exclusive else f">= {low}"
        if low is None:
            return f"<= {high}"
        return f"in ({low}, {high}]" if self.exclusive else f"in [{low}, {high}]"


ANY = Bounds()
NON_NEGATIVE = Bounds(0)
"""The default of numbers, durations and counts."""
POSITIVE = Bounds(0, exclusive=True)


def _integer(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"must be an integer, got {value!r}")
    return value


def _number(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"must be finite, got {value!r}")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


class FieldReader:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def typed(
        self,
        value: Any,
        path: str,
        default: Any,
        placeholder: Any,
        convert: Callable[[Any], Any],
        bounds: Bounds = ANY,
        unit: str = "",
    ) -> Any:
        """`convert(value)` (its ValueError is the message), checked against
        `bounds`; see the module docstring for `default` and `placeholder`."""
        if value is None:
            if default is REQUIRED:
                self.fail(path, "required")
                return placeholder
            return default
        fallback = placeholder if default is REQUIRED else default
        try:
            result = convert(value)
        except ValueError as error:
            self.fail(path, str(error))
            return fallback
        if bounds is not ANY and not bounds.hold(result):
            self.fail(path, f"must be {bounds.words(unit)}, got {value!r}")
            return fallback
        return result

    def mapping(self, value: Any, path: str, allowed: frozenset[str] | set[str]) -> dict[str, Any]:
        """The allowed keys of a mapping (empty when absent); `path` "" is the root."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path or "<document>", f"must be a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                self.fail(f"{path}.{key}" if path else str(key), "unknown field")
        return {key: item for key, item in value.items() if key in allowed}

    def sequence(self, value: Any, path: str) -> list[Any]:
        """A list (empty when absent)."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, f"must be a list, got {type(value).__name__}")
            return []
        return value

    def integer(
        self, value: Any, path: str, default: Any = REQUIRED, bounds: Bounds = NON_NEGATIVE
    ) -> Any:
        return self.typed(value, path, default, 1, _integer, bounds)

    def number(
        self, value: Any, path: str, default: Any = REQUIRED, bounds: Bounds = NON_NEGATIVE
    ) -> Any:
        """A finite number, as a float (an integer is a number)."""
        return self.typed(value, path, default, 1.0, _number, bounds)

    def duration(
        self, value: Any, path: str, default: Any = REQUIRED, bounds: Bounds = NON_NEGATIVE
    ) -> Any:
        """Seconds from a Go duration string (see `epp.api.units`)."""
        return self.typed(value, path, default, 1.0, parse_duration, bounds, unit="s")

    def boolean(self, value: Any, path: str, default: Any = REQUIRED) -> Any:
        return self.typed(value, path, default, False, _boolean)

    def size(self, value: Any, path: str, default: Any = REQUIRED) -> Any:
        """A byte count: an integer or a Kubernetes quantity ("1Gi")."""
        return self.typed(value, path, default, 1, parse_byte_size)

    quantity = size
    """A count written as an integer or a Kubernetes quantity ("5k")."""

    def string(
        self,
        value: Any,
        path: str,
        default: Any = REQUIRED,
        empty: bool = False,
        choices: tuple[str, ...] = (),
    ) -> Any:
        """A string (non-empty unless `empty`), one of `choices` when given."""

        def convert(text: Any) -> str:
            if not isinstance(text, str) or (not text and not empty):
                raise ValueError(f"must be {'a' if empty else 'a non-empty'} string, got {text!r}")
            if choices and text not in choices:
                raise ValueError(f"must be one of {', '.join(choices)}; got {text!r}")
            return text

        return self.typed(value, path, default, None, convert)
