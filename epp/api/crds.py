"""The CustomResourceDefinitions this package validates against.

The CRDs ship inside the package (`epp/api/crds/*.yaml`, copies of
`config/crd/`), so validation follows the CRD text: a changed CRD changes the
validation without a code change. They are read once, on first use, from the
installed package's own data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml


@dataclass(slots=True, frozen=True)
class ServedVersion:
    group: str
    version: str
    kind: str
    schema: dict[str, Any]
    namespaced: bool
    storage: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def versions_of(crd: dict[str, Any]) -> list[ServedVersion]:
    """The served versions of one CRD object."""
    spec = crd["spec"]
    return [
        ServedVersion(
            group=spec["group"],
            version=version["name"],
            kind=spec["names"]["kind"],
            schema=version["schema"]["openAPIV3Schema"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            storage=bool(version.get("storage")),
        )
        for version in spec["versions"]
        if version.get("served", True)
    ]


@cache
def bundled() -> dict[tuple[str, str], ServedVersion]:
    """(apiVersion, kind) -> served version, for every bundled CRD."""
    served: dict[tuple[str, str], ServedVersion] = {}
    for entry in sorted(resources.files("epp.api").joinpath("crds").iterdir(), key=str):
        if entry.name.endswith(".yaml"):
            for version in versions_of(yaml.safe_load(entry.read_text(encoding="utf-8"))):
                served[(version.api_version, version.kind)] = version
    return served


def lookup(api_version: str, kind: str) -> ServedVersion | None:
    return bundled().get((api_version, kind))
