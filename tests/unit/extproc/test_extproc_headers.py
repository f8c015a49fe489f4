"""Control header values: durations, TTFT."""

from __future__ import annotations

import pytest

from epp.extproc.headers import (
    BadHeader,
    first,
    parse_ttft_slo,
    parse_ttl,
)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("1.5m", 90.0), (" 250ms ", 0.25)])
def test_ttl_is_a_go_duration(text, seconds):
    assert parse_ttl(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "5s junk", "1d", "7", "1.5", "nan", "inf"])
def test_ttl_that_is_not_a_go_duration_is_a_bad_header(text):
    with pytest.raises(BadHeader, match="not a duration"):
        parse_ttl(text)


@pytest.mark.parametrize("text", ["0", "0s", "-5s", "-1s"])
def test_ttl_must_be_positive(text):
    with pytest.raises(BadHeader, match="positive"):
        parse_ttl(text)


def test_ttft_is_milliseconds_to_seconds():
    assert parse_ttft_slo("1500") == 1.5


def test_first_prefers_the_first_name():
    assert first({"b": "2", "a": "1"}, ("a", "b")) == "1"
    assert first({"b": "2"}, ("a", "b")) == "2"
    assert first({}, ("a",)) is None
