"""Where endpoints come from: Kubernetes pods, a static `ip:port,...` list, or
an endpoints file in the reference's file-discovery format (with labels, so
that each endpoint can name its engine)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from epp.api.address import canonical_ip, format_address, parse_address, valid_port
from epp.api.models import DEFAULT_NAMESPACE


@dataclass(slots=True, frozen=True)
class EndpointSpec:
    """One endpoint as its source describes it (no metrics); `id` is its
    identity in the reference EPP (`namespace/name`, see `Endpoint.id`)."""

    name: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    id: str = ""


def pod_endpoints(
    pod_name: str,
    pod_ip: str,
    labels: Mapping[str, str],
    target_ports: Iterable[int],
    namespace: str = DEFAULT_NAMESPACE,
) -> list[EndpointSpec]:
    """One endpoint per target port of a ready pod. With several ports each
    endpoint's name is `<pod>-<port>`, otherwise the pod's name; its id is
    the reference's, `<namespace>/<pod>-rank-<index of the port>`."""
    ports = list(target_ports)
    if not ports:
        raise ValueError(f"pod {pod_name}: no target ports")
    return [
        EndpointSpec(
            name=pod_name if len(ports) == 1 else f"{pod_name}-{port}",
            address=format_address(pod_ip, port),
            labels=dict(labels),
            id=f"{namespace}/{pod_name}-rank-{rank}",
        )
        for rank, port in enumerate(ports)
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
        try:
            address = format_address(*parse_address(entry))
        except ValueError as error:
            raise ValueError(f"static endpoint {error}") from None
        if address in seen:
            raise ValueError(f"static endpoint {entry!r} is listed twice")
        seen.add(address)
        specs.append(EndpointSpec(name=address, address=address, labels=dict(labels or {})))
    if not specs:
        raise ValueError("the static endpoint list is empty")
    return specs


def parse_endpoints_document(text: str) -> list[EndpointSpec]:
    """Endpoints from the reference's file-discovery YAML or JSON:

        endpoints:
          - name: <unique>        # required
            address: <IP>         # required
            port: "8000"          # required, 1-65535 (string or number)
            namespace: default    # optional; with name, the endpoint's id
            labels: {k: v}        # optional

    Raises ValueError naming the first bad entry."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"endpoints file is not YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("endpoints"), list | None):
        raise ValueError("endpoints file must be a mapping with an `endpoints` list")
    specs: list[EndpointSpec] = []
    names: set[str] = set()
    addresses: set[str] = set()
    for index, entry in enumerate(document.get("endpoints") or []):
        spec = _document_entry(entry, f"endpoints[{index}]")
        if spec.name in names or spec.address in addresses:
            raise ValueError(f"endpoints[{index}]: {spec.name} ({spec.address}) is listed twice")
        names.add(spec.name)
        addresses.add(spec.address)
        specs.append(spec)
    return specs


def _document_entry(entry: Any, path: str) -> EndpointSpec:
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: must be a mapping")
    name, address, port = entry.get("name"), entry.get("address"), entry.get("port")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}.name: required")
    try:
        ip = canonical_ip(str(address))
    except ValueError as error:
        raise ValueError(f"{path}.address: {error}") from None
    try:
        port = valid_port(port)
    except ValueError as error:
        raise ValueError(f"{path}.port: {error}") from None
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in labels.items()
    ):
        raise ValueError(f"{path}.labels: must map strings to strings")
    namespace = entry.get("namespace") or DEFAULT_NAMESPACE
    if not isinstance(namespace, str):
        raise ValueError(f"{path}.namespace: must be a string")
    return EndpointSpec(name, format_address(ip, port), labels, f"{namespace}/{name}")
