"""Typed InferenceObjective and InferencePool, parsed from Kubernetes objects.

Both InferenceObjective versions become one shape: v1alpha2's `poolRef`
becomes a one-entry `pool_refs`; an unset priority is 0. `decode` validates
against the bundled CRD first, so every object built here is one the API
server would have accepted, with its defaults applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from epp.api.labels import LabelSelector, SelectorError
from epp.api.schema import FieldError
from epp.api.validation import check

OBJECTIVE_GROUP = "llm-d.ai"
OBJECTIVE_KIND = "InferenceObjective"
POOL_GROUP = "inference.networking.k8s.io"
POOL_KIND = "InferencePool"
POOL_API_VERSION = f"{POOL_GROUP}/v1"
DEFAULT_NAMESPACE = "default"


class InvalidObjectError(ValueError):
    """An object the API server would refuse; `errors` says where and why."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(error) for error in errors))
        self.errors = errors


@dataclass(slots=True, frozen=True)
class PoolRef:
    name: str
    group: str = POOL_GROUP
    kind: str = POOL_KIND


@dataclass(slots=True, frozen=True)
class InferenceObjective:
    """An objective in either version. `api_version` records the source."""

    name: str
    namespace: str = DEFAULT_NAMESPACE
    priority: int = 0
    pool_refs: tuple[PoolRef, ...] = ()
    pool_selector: LabelSelector | None = None
    api_version: str = f"{OBJECTIVE_GROUP}/v1"


class FailureMode(StrEnum):
    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


@dataclass(slots=True, frozen=True)
class EndpointPickerRef:
    name: str
    group: str = ""
    kind: str = "Service"
    port: int | None = None
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE


@dataclass(slots=True, frozen=True)
class InferencePool:
    """An InferencePool v1: `selector` picks its pods (matchLabels only),
    `labels` are the pool object's own labels (what poolSelectors match)."""

    name: str
    namespace: str = DEFAULT_NAMESPACE
    labels: Mapping[str, str] = field(default_factory=dict)
    selector: Mapping[str, str] = field(default_factory=dict)
    target_ports: tuple[int, ...] = ()
    app_protocol: str = "http"
    endpoint_picker_ref: EndpointPickerRef | None = None


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, dict[str, str]]:
    metadata = obj.get("metadata") or {}
    return (
        metadata["name"],
        metadata.get("namespace") or DEFAULT_NAMESPACE,
        dict(metadata.get("labels") or {}),
    )


def _pool_ref(ref: Mapping[str, Any]) -> PoolRef:
    return PoolRef(ref["name"], ref.get("group", POOL_GROUP), ref.get("kind", POOL_KIND))


def _objective(obj: Mapping[str, Any]) -> InferenceObjective:
    name, namespace, _ = _meta(obj)
    spec = obj.get("spec") or {}
    refs = [_pool_ref(spec["poolRef"])] if "poolRef" in spec else []
    refs += [_pool_ref(ref) for ref in spec.get("poolRefs") or ()]
    selector = spec.get("poolSelector")
    try:
        pool_selector = None if selector is None else LabelSelector.from_dict(selector)
    except SelectorError as error:
        path = f"spec.poolSelector.{error.path}"
        raise InvalidObjectError([FieldError(path, error.kind, None, error.detail)]) from None
    return InferenceObjective(
        name=name,
        namespace=namespace,
        priority=spec.get("priority", 0),
        pool_refs=tuple(refs),
        pool_selector=pool_selector,
        api_version=obj["apiVersion"],
    )


def _pool(obj: Mapping[str, Any]) -> InferencePool:
    name, namespace, labels = _meta(obj)
    spec = obj["spec"]
    picker = spec.get("endpointPickerRef")
    return InferencePool(
        name=name,
        namespace=namespace,
        labels=labels,
        selector=dict(spec["selector"]["matchLabels"]),
        target_ports=tuple(port["number"] for port in spec["targetPorts"]),
        app_protocol=spec.get("appProtocol", "http"),
        endpoint_picker_ref=None
        if picker is None
        else EndpointPickerRef(
            name=picker["name"],
            group=picker.get("group", ""),
            kind=picker.get("kind", "Service"),
            port=(picker.get("port") or {}).get("number"),
            failure_mode=FailureMode(picker.get("failureMode", "FailClose")),
        ),
    )


def decode(obj: Any, strict: bool = True) -> InferenceObjective | InferencePool:
    """Validate `obj` against its CRD and build the typed object.

    Raises InvalidObjectError naming every bad field. With `strict`, fields
    the version does not declare are errors; otherwise they are pruned."""
    checked = check(obj, strict=strict)
    if not checked.valid:
        raise InvalidObjectError(checked.errors)
    if checked.object["kind"] == OBJECTIVE_KIND:
        return _objective(checked.object)
    return _pool(checked.object)
