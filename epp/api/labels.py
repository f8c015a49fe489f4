"""Kubernetes label selectors: matchLabels and matchExpressions.

Semantics follow `k8s.io/apimachinery/pkg/labels`: all requirements are ANDed;
`In` needs the key present with one of the values, `NotIn` matches when the key
is absent or its value is none of the values, `Exists`/`DoesNotExist` look at the
key only. A selector with no requirements matches everything (the CRDs forbid
empty pool selectors; that is validation's job, not the matcher's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class SelectorError(ValueError):
    """A selector requirement that Kubernetes would refuse to build."""

    def __init__(self, path: str, kind: str, detail: str) -> None:
        super().__init__(f"{path}: {kind}: {detail}")
        self.path = path
        self.kind = kind
        self.detail = detail


class Operator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(slots=True, frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case Operator.IN:
                return self.key in labels and labels[self.key] in self.values
            case Operator.NOT_IN:
                return self.key not in labels or labels[self.key] not in self.values
            case Operator.EXISTS:
                return self.key in labels
            case Operator.DOES_NOT_EXIST:
                return self.key not in labels


@dataclass(slots=True, frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    @classmethod
    def from_dict(cls, selector: Mapping[str, Any]) -> LabelSelector:
        """Parse `{matchLabels, matchExpressions}`. Raises SelectorError for an
        unknown operator, or values that do not fit the operator, with the
        field path relative to the selector."""
        requirements = [
            Requirement(key, Operator.IN, frozenset({value}))
            for key, value in sorted((selector.get("matchLabels") or {}).items())
        ]
        for index, expression in enumerate(selector.get("matchExpressions") or ()):
            path = f"matchExpressions[{index}]"
            try:
                operator = Operator(expression["operator"])
            except ValueError:
                supported = ", ".join(f'"{op.value}"' for op in Operator)
                raise SelectorError(
                    f"{path}.operator",
                    "Unsupported value",
                    f'"{expression["operator"]}": supported values: {supported}',
                ) from None
            values = frozenset(expression.get("values") or ())
            if operator in (Operator.IN, Operator.NOT_IN) and not values:
                raise SelectorError(
                    f"{path}.values",
                    "Required value",
                    "must be specified when `operator` is 'In' or 'NotIn'",
                )
            if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
                raise SelectorError(
                    f"{path}.values",
                    "Forbidden",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            requirements.append(Requirement(expression["key"], operator, values))
        return cls(tuple(requirements))
