"""Where endpoints come from: Kubernetes pods or a static `ip:port,...` list."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class EndpointSpec:
    """One endpoint as its source describes it (no metrics)."""

    name: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def format_address(ip: str, port: int) -> str:
    """`ip:port`, with an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def pod_endpoints(
    pod_name: str, pod_ip: str, labels: Mapping[str, str], target_ports: Iterable[int]
) -> list[EndpointSpec]:
    """One endpoint per target port of a ready pod. With several ports each
    endpoint's name is `<pod>-<port>`, otherwise the pod's name."""
    ports = list(target_ports)
    if not ports:
        raise ValueError(f"pod {pod_name}: no target ports")
    return [
        EndpointSpec(
            name=pod_name if len(ports) == 1 else f"{pod_name}-{port}",
            address=format_address(pod_ip, port),
            labels=dict(labels),
        )
        for port in ports
    ]


def parse_static_endpoints(
    text: str, labels: Mapping[str, str] | None = None
) -> list[EndpointSpec]:
    """Endpoints from `ip:port,ip:port,...` (IPv6 as `[ip]:port`), each named
    after its address. Raises ValueError naming the first bad entry."""
    specs: list[EndpointSpec] = []
    seen: set[str] = set()
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        host, sep, port_text = entry.rpartition(":")
        if not sep or not host:
            raise ValueError(f"static endpoint {entry!r} is not ip:port")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"static endpoint {entry!r}: {host!r} is not an IP address") from None
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"static endpoint {entry!r}: port must be 1-65535")
        address = format_address(str(ip), int(port_text))
        if address in seen:
            raise ValueError(f"static endpoint {entry!r} is listed twice")
        seen.add(address)
        specs.append(EndpointSpec(name=address, address=address, labels=dict(labels or {})))
    if not specs:
        raise ValueError("the static endpoint list is empty")
    return specs
