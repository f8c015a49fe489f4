"""Endpoint addresses: the one `ip:port` format of the EPP.

An address is `ip:port` with an IPv6 address in brackets (`[fd00::1]:8000`):
the form Envoy's ORIGINAL_DST cluster reads from the destination header, and
the endpoint store's key. Every endpoint source (static list, pods, the
simulator's servers) writes addresses through `format_address`, so the rest
of the EPP passes them on and compares them as strings; `parse_address` reads
one a user wrote, `address_ip` takes the IP back out (to match Envoy's subset
hints, which may also be bare IPs).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache


def format_address(ip: str, port: int) -> str:
    """`ip:port`, with an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def canonical_ip(text: str) -> str:
    """`text` as an IP address in canonical form; ValueError if it is none."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


def valid_port(value: object) -> int:
    """`value` (an int or its digits) as a port; ValueError unless 1-65535."""
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"port must be 1-65535, got {value!r}")
    return int(text)


@lru_cache(maxsize=4096)
def parse_address(text: str) -> tuple[str, int]:
    """The (ip, port) of `ip:port` (IPv6 as `[ip]:port`), the IP in its
    canonical form; memoised, as the same addresses come back per request.
    Raises ValueError saying what is wrong with `text`."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not ip:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return canonical_ip(host), valid_port(port_text)
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from None


@lru_cache(maxsize=4096)
def address_ip(address: str) -> str:
    """The IP of `ip:port`, `[ipv6]:port`, or a bare IP; memoised, since every
    pool snapshot re-creates its endpoints."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    if address.count(":") == 1:
        return address.split(":", 1)[0]
    return address
