"""InferenceObjectives of the namespace, from the watch into the registry.

They are read through `llm-d.ai/v1alpha2`, the storage version: the CRD has
conversion None, so the API server prunes what the served version does not
declare, and an objective written with v1alpha2's `poolRef` reads back
through v1 without it. v1alpha2 declares every v1 field as well, so nothing
is lost this way.

An object the API server holds but our decoder refuses (it should not
happen: the decoder checks the same CRD) is logged, and the last good
version of it stays in force, so a decoder bug never drops a priority.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from epp.api.models import InferenceObjective, InvalidObjectError, decode
from epp.api.registry import ObjectiveRegistry

log = logging.getLogger(__name__)

GROUP = "llm-d.ai"
READ_VERSION = "v1alpha2"
PLURAL = "inferenceobjectives"


class ObjectiveSource:
    """The reflector handler for objectives. Keeps the raw objects (for
    status) and the decoded ones, and feeds the registry once it exists.
    `on_change(name)` hears of every objective that changed or left."""

    def __init__(self, on_change: Callable[[str], None] | None = None) -> None:
        self.raw: dict[str, dict[str, Any]] = {}
        self.decoded: dict[str, InferenceObjective] = {}
        self._registry: ObjectiveRegistry | None = None
        self._on_change = on_change

    def attach(self, registry: ObjectiveRegistry) -> None:
        """Feed `registry` from now on, starting with everything known."""
        self._registry = registry
        registry.replace(self.decoded.values())

    def replace(self, objects: list[dict[str, Any]]) -> None:
        gone = set(self.raw) - {obj["metadata"]["name"] for obj in objects}
        for name in gone:
            self._forget(name)
        for obj in objects:
            self._remember(obj)
        if self._registry is not None:
            self._registry.replace(self.decoded.values())
        for name in gone | {obj["metadata"]["name"] for obj in objects}:
            self._changed(name)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self._forget(name)
            if self._registry is not None:
                self._registry.delete(name)
        else:
            objective = self._remember(obj)
            if objective is not None and self._registry is not None:
                self._registry.apply(objective)
        self._changed(name)

    def _remember(self, obj: dict[str, Any]) -> InferenceObjective | None:
        name = obj["metadata"]["name"]
        self.raw[name] = obj
        try:
            objective = decode(obj, strict=False)
        except InvalidObjectError as error:
            log.error(
                "InferenceObjective %s refused, keeping its last good version: %s", name, error
            )
            return None
        assert isinstance(objective, InferenceObjective)
        self.decoded[name] = objective
        return objective

    def _forget(self, name: str) -> None:
        self.raw.pop(name, None)
        self.decoded.pop(name, None)

    def _changed(self, name: str) -> None:
        if self._on_change is not None:
            self._on_change(name)
