"""Validation of a Kubernetes object against its bundled CRD, as the API
server does it: type meta, object meta (name, namespace, labels), then the
version's structural schema with defaults, pruning and CEL rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.api import crds
from epp.api.schema import FieldError, render, validate

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)


@dataclass(slots=True)
class Checked:
    """An object after validation: defaulted and pruned, and its errors."""

    object: dict[str, Any]
    errors: list[FieldError] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors


def _metadata(metadata: Any, namespaced: bool) -> list[FieldError]:
    if not isinstance(metadata, Mapping):
        return [FieldError("metadata", "Required value", None, "metadata must be an object")]
    errors: list[FieldError] = []
    name = metadata.get("name")
    if not name:
        errors.append(
            FieldError("metadata.name", "Required value", None, "name or generateName is required")
        )
    elif not isinstance(name, str) or len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        errors.append(FieldError("metadata.name", "Invalid value", render(name), SUBDOMAIN_MESSAGE))
    namespace = metadata.get("namespace")
    if namespace is not None and not namespaced:
        errors.append(
            FieldError("metadata.namespace", "Forbidden", None, "not allowed on this type")
        )
    elif namespace is not None and (
        not isinstance(namespace, str) or len(namespace) > 63 or not DNS1123_LABEL.match(namespace)
    ):
        errors.append(
            FieldError("metadata.namespace", "Invalid value", render(namespace), LABEL_MESSAGE)
        )
    labels = metadata.get("labels") or {}
    if not isinstance(labels, Mapping):
        return [*errors, FieldError("metadata.labels", "Invalid value", render(labels), "")]
    for key, value in labels.items():
        prefix, _, label = str(key).rpartition("/")
        if (
            not LABEL_NAME.match(label)
            or len(label) > 63
            or (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)))
        ):
            errors.append(
                FieldError(
                    "metadata.labels",
                    "Invalid value",
                    render(key),
                    "name part must be a valid label key",
                )
            )
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(
                FieldError(
                    f"metadata.labels.{key}",
                    "Invalid value",
                    render(value),
                    "a valid label must be an empty string or consist of alphanumeric characters, "
                    "'-', '_' or '.', and must start and end with an alphanumeric character",
                )
            )
    return errors


def _type_meta_errors(api_version: Any, kind: Any) -> list[FieldError]:
    errors = []
    if not api_version:
        errors.append(FieldError("apiVersion", "Required value"))
    if not kind:
        errors.append(FieldError("kind", "Required value"))
    if errors:
        return errors
    supported = ", ".join(f"{v} {k}" for v, k in sorted(crds.bundled()))
    served = sorted(v for v, k in crds.bundled() if k == kind)
    # An object written for a group the kind has left (GIE's
    # inference.networking.x-k8s.io InferenceObjective) is told where it went.
    moved = f"; {kind} is served as {' and '.join(served)}: change apiVersion" if served else ""
    return [
        FieldError(
            "kind",
            "Invalid value",
            render(kind),
            f"no kind {render(kind)} is known in version {render(api_version)}{moved}; "
            f"known: {supported}, and EndpointPickerConfig",
        )
    ]


def check(obj: Any, strict: bool = True) -> Checked:
    """Validate one object of a kind with a bundled CRD.

    The result's object carries the API server's defaults and, for fields the
    version does not declare, is pruned (strict mode also reports them)."""
    if not isinstance(obj, Mapping):
        return Checked({}, [FieldError("", "Invalid value", render(obj), "must be an object")])
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    served = crds.lookup(str(api_version), str(kind))
    if served is None:
        return Checked(dict(obj), _type_meta_errors(api_version, kind))
    errors = _metadata(obj.get("metadata"), served.namespaced)
    body = {key: value for key, value in obj.items() if key != "metadata"}
    checked, schema_errors = validate(body, served.schema, strict=strict)
    checked["metadata"] = obj.get("metadata")
    return Checked(checked, errors + schema_errors)
