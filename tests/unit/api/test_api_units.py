"""Go durations and Kubernetes quantities, as the reference reads them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.api.units import format_duration, parse_byte_size, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("60s", 60.0),
        ("500ms", 0.5),
        ("0s", 0.0),
        ("0", 0.0),
        ("-0", 0.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("1.5s", 1.5),
        ("1.s", 1.0),
        (".5s", 0.5),
        ("+2s", 2.0),
        ("-1s", -1.0),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("250μs", 0.00025),
        ("10ns", 1e-8),
        ("2h45m", 9900.0),
    ],
)
def test_durations_read_as_go_parses_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["1.5", "60", "5x", "s", ".s", "1m 30s", "", "-", " 1s", "1sm", "3000000h"]
)
def test_what_go_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", [3, 0.25, True, None])
def test_a_duration_is_a_string(value: Any) -> None:
    with pytest.raises(ValueError, match="duration string"):
        parse_duration(value)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["ms", "s", "m", "h"]))
def test_whole_units_scale_exactly(count: int, unit: str) -> None:
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    assert parse_duration(f"{count}{unit}") == pytest.approx(count * scale)


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_a_written_duration_reads_back_to_the_nanosecond(nanoseconds: int) -> None:
    seconds = nanoseconds / 1e9
    assert abs(parse_duration(format_duration(seconds)) - seconds) <= 1e-9 + abs(seconds) * 1e-9


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.2, "200ms"), (1.5, "1.5s"), (60.0, "60s"), (0.0, "0s")]
)
def test_a_duration_is_written_in_its_largest_unit_below_a_minute(
    seconds: float, text: str
) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**4), st.integers(min_value=0, max_value=59))
def test_terms_add_up(minutes: int, seconds: int) -> None:
    assert parse_duration(f"{minutes}m{seconds}s") == pytest.approx(minutes * 60 + seconds)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (0, 0),
        (1024, 1024),
        ("1024", 1024),
        ("1Ki", 1024),
        ("1Gi", 1 << 30),
        ("1.5Gi", 3 << 29),
        ("500M", 500_000_000),
        ("1k", 1000),
        ("1e3", 1000),
        ("1E6", 1_000_000),
        ("500m", 1),
    ],
)
def test_byte_sizes_read_as_quantities(value: Any, size: int) -> None:
    assert parse_byte_size(value) == size


@pytest.mark.parametrize("value", ["-1", -1, "1GB", "1 Gi", "", "Gi", True, 1.5, None])
def test_bad_byte_sizes_are_refused(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_byte_size(value)
