"""The one `ip:port` format: written, read back, and its IP taken out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.api.address import address_ip, format_address, parse_address


def test_an_ipv6_address_is_written_in_brackets():
    assert format_address("fd00::1", 8000) == "[fd00::1]:8000"


def test_an_ipv4_address_is_written_plain():
    assert format_address("10.0.0.1", 8000) == "10.0.0.1:8000"


def test_parsing_gives_the_canonical_ip():
    assert parse_address("[FD00:0::1]:80") == ("fd00::1", 80)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1", "is not ip:port"),
        (":80", "is not ip:port"),
        ("host.example:80", "is not an IP address"),
        ("10.0.0.1:0", "port must be 1-65535"),
        ("10.0.0.1:65536", "port must be 1-65535"),
        ("10.0.0.1:http", "port must be 1-65535"),
    ],
)
def test_a_bad_address_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_address(text)


@pytest.mark.parametrize(
    ("text", "ip"),
    [
        ("10.0.0.1:80", "10.0.0.1"),
        ("[fd00::1]:80", "fd00::1"),
        ("10.0.0.2", "10.0.0.2"),
        ("fd00::2", "fd00::2"),
    ],
)
def test_the_ip_of_an_address_or_a_bare_ip(text, ip):
    assert address_ip(text) == ip


@given(st.ip_addresses(), st.integers(1, 65535))
def test_a_formatted_address_parses_back_to_its_ip_and_port(ip, port):
    address = format_address(str(ip), port)
    assert parse_address(address) == (str(ip), port)
    assert address_ip(address) == str(ip)
