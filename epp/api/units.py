"""Units the reference EPP's interface is written in: Go durations and
Kubernetes quantities. The one home of both parsers; the command line, the
configuration file and the request headers all read through here.

- Durations follow Go's `time.ParseDuration` (what the reference's flags
  and its config's `metav1.Duration` fields use): an optional sign, then one
  or more decimal numbers each with a unit (`ns`, `us`, `µs`, `μs`, `ms`,
  `s`, `m`, `h`), e.g. "300ms", "-1.5h", "2h45m". A bare number is refused
  except "0". Values beyond Go's range (about 292 years) are refused.
- Byte sizes follow `resource.Quantity` (the reference's `maxBytes`): an
  integer or a string with an optional binary (`Ki`..`Ei`), decimal
  (`k`, `M`..`E`, `m`, `u`, `n`) or exponent (`e3`) suffix; fractions round
  up to a whole byte, as `Quantity.Value()` does.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_TERM = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]*)")
_MAX_NANOSECONDS = (1 << 63) - 1
_DURATION_HINT = 'use e.g. "60s", "500ms", "1m30s"'
_SIZE_HINT = 'must be a byte count or quantity such as "1Gi"'


def parse_duration(text: str) -> float:
    """Seconds from a Go duration string; ValueError naming the text otherwise."""
    if not isinstance(text, str):
        raise ValueError(f'must be a duration string such as "60s", got {text!r}')
    original, body = text, text
    negative = body[:1] == "-"
    if body[:1] in "+-" and body:
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {original!r}; {_DURATION_HINT}")
    total = Decimal(0)
    position = 0
    while position < len(body):
        match = _DURATION_TERM.match(body, position)
        whole, fraction, unit = match.group(1), match.group(2), match.group(3)  # type: ignore[union-attr]
        if not whole and not fraction:
            raise ValueError(f"invalid duration {original!r}; {_DURATION_HINT}")
        if not unit:
            raise ValueError(f"missing unit in duration {original!r}; {_DURATION_HINT}")
        scale = _DURATION_UNITS_NS.get(unit)
        if scale is None:
            raise ValueError(f"unknown unit {unit!r} in duration {original!r}; {_DURATION_HINT}")
        total += Decimal(f"{whole or 0}.{fraction or 0}") * scale
        position = match.end()  # type: ignore[union-attr]
    nanoseconds = int(total)  # Go truncates the fractional nanoseconds
    if nanoseconds > _MAX_NANOSECONDS + (1 if negative else 0):
        raise ValueError(f"invalid duration {original!r}: out of range")
    return (-nanoseconds if negative else nanoseconds) / 1e9


def format_duration(seconds: float) -> str:
    """`seconds` as a Go duration string that `parse_duration` reads back
    to the nanosecond ("200ms", "1.5s", "90s"): what a configuration or a
    flag is written in."""
    nanoseconds = round(seconds * 1e9)
    if nanoseconds == 0:
        return "0s"
    sign, size = ("-" if nanoseconds < 0 else ""), abs(nanoseconds)
    scale, unit = next(
        (scale, unit)
        for scale, unit in ((10**9, "s"), (10**6, "ms"), (10**3, "us"), (1, "ns"))
        if size >= scale
    )
    amount = (Decimal(size) / scale).normalize()
    return f"{sign}{amount:f}{unit}"


_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))([eE][+-]?\d+|[A-Za-z]*)")


def parse_byte_size(value: Any) -> int:
    """Bytes from an integer or a quantity string; ValueError otherwise.
    Negative sizes are refused, as the reference's loader does."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{_SIZE_HINT}, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _QUANTITY.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{_SIZE_HINT}, got {value!r}")
        number, suffix = Decimal(match.group(1)), match.group(2)
        try:
            if suffix in _BINARY:
                amount = number * _BINARY[suffix]
            elif suffix in _DECIMAL:
                amount = number * _DECIMAL[suffix]
            elif suffix[:1] in ("e", "E") and len(suffix) > 1:
                amount = number.scaleb(int(suffix[1:]))
            else:
                raise ValueError(f"{_SIZE_HINT}, got {value!r} (unknown suffix {suffix!r})")
        except InvalidOperation:
            raise ValueError(f"{_SIZE_HINT}, got {value!r}") from None
        size = math.ceil(amount)
    if size < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return size
