"""Control header values: durations, TTFT, endpoint formatting."""

from __future__ import annotations

import pytest

from epp.extproc.headers import (
    BadHeader,
    endpoint_ip,
    first,
    format_endpoint,
    parse_duration,
    parse_ttft_slo,
    parse_ttl,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1h2m3s", 3723.0),
        ("250ms", 0.25),
        ("1.5m", 90.0),
        ("10us", 1e-5),
        ("7", 7.0),
    ],
)
def test_go_durations_and_plain_numbers_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "5s junk", "-5s", "1d"])
def test_malformed_duration_raises(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0", "0s", "-1", "nan", "inf"])
def test_ttl_must_be_positive_and_finite(text):
    with pytest.raises(BadHeader):
        parse_ttl(text)


def test_ttft_is_milliseconds_to_seconds():
    assert parse_ttft_slo("1500") == 1.5


def test_first_prefers_the_first_name():
    assert first({"b": "2", "a": "1"}, ("a", "b")) == "1"
    assert first({"b": "2"}, ("a", "b")) == "2"
    assert first({}, ("a",)) is None


@pytest.mark.parametrize(
    ("endpoint", "formatted"),
    [("10.0.0.1:80", "10.0.0.1:80"), ("fd00::1:80", "[fd00::1]:80"), ("[::1]:80", "[::1]:80")],
)
def test_ipv6_hosts_are_bracketed(endpoint, formatted):
    assert format_endpoint(endpoint) == formatted


@pytest.mark.parametrize(
    ("entry", "ip"),
    [("10.0.0.1:80", "10.0.0.1"), ("[fd00::1]:80", "fd00::1"), ("10.0.0.2", "10.0.0.2")],
)
def test_subset_entries_match_by_ip(entry, ip):
    assert endpoint_ip(entry) == ip
