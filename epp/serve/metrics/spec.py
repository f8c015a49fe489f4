"""What a metric's declaration is (`Spec`): its exposed name, kind, labels,
help, buckets and deprecated twin (`Twin`), checked when declared. The
declarations themselves are `catalogue`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType


class Kind(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(slots=True, frozen=True)
class Twin:
    """The deprecated name of a metric, with the canonical `labels` it keeps
    (in its order), `rename` (canonical -> its own name of a label), and
    its own help when the reference worded it otherwise."""

    name: str
    labels: tuple[str, ...] | None = None
    """None: all the canonical labels."""
    rename: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    help: str = ""


@dataclass(slots=True, frozen=True)
class Spec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    twin: Twin | None = None

    def __post_init__(self) -> None:
        if (self.kind is Kind.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"{self.name}: buckets go with histograms, and only with them")
        if (self.kind is Kind.COUNTER) != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: a counter's name ends in _total, only a counter's")
        twin = self.twin
        if twin is not None and twin.labels is not None:
            unknown = set(twin.labels) - set(self.labels)
            if unknown:
                raise ValueError(f"{self.name}: twin labels {sorted(unknown)} are not its labels")

    @property
    def pick(self) -> tuple[int, ...]:
        """The positions of the twin's labels among the canonical ones."""
        twin = self.twin
        if twin is None or twin.labels is None:
            return tuple(range(len(self.labels)))
        return tuple(self.labels.index(label) for label in twin.labels)

    @property
    def twin_labels(self) -> tuple[str, ...]:
        twin = self.twin
        if twin is None:
            return ()
        kept = self.labels if twin.labels is None else twin.labels
        return tuple(twin.rename.get(label, label) for label in kept)

    @property
    def twin_help(self) -> str:
        twin = self.twin
        if twin is None:
            return ""
        return twin.help or f"[Deprecated: use {self.name}] {self.help}"
