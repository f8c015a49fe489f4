"""Reading a parsed YAML document field by field, collecting every error
with its path ("flowControl.gate.kinds[1]: ...") instead of stopping at the
first. The EPP configuration and the simulator's scenarios build on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class FieldReader:
    unknown_field = "unknown field"
    """The message for a key that the mapping does not allow."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str, allowed: frozenset[str] | set[str]) -> dict[str, Any]:
        """The allowed keys of a mapping (empty when absent); `path` "" is the root."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                self.fail(f"{path}.{key}" if path else str(key), self.unknown_field)
        return {key: item for key, item in value.items() if key in allowed}

    def sequence(self, value: Any, path: str) -> list[Any]:
        """A list (empty when absent)."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, f"must be a list, got {type(value).__name__}")
            return []
        return value
