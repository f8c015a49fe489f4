"""Usage-limit policies: how much of its capacity each band may use.

A policy gives each active band (priorities highest first) a ceiling in
[0, 1]; a band may dispatch while the saturation it is compared with stays
below its ceiling. These are the reference EPP's three policies, with its
type names and parameters:

- `static-usage-limit-policy`: one `threshold` for every band (1.0: no
  gating);
- `priority-holdback-policy`: ceilings from `maxCeiling` (top band) down to
  `minCeiling` (lowest), evenly by rank or in proportion to the priority
  values; one band alone gets `maxCeiling`;
- `soft-reflective-ceiling-policy`: band i's ceiling is 1 - i x saturation
  / (N - 1); a band at or past it is open on one call in round(s / (1 - s))
  (one tick shared by all bands, so the gating is monotone by rank), and
  closed at saturation 1.0. The top band is never limited.

The adaptive gate (`epp.flowcontrol.adaptive`) compares each endpoint's own
saturation (in flight / learned limit) with the ceilings, so a band below
the top leaves room on every endpoint that only higher bands can use.

Cost: static ceilings are computed once per set of bands; the reflective
policy's per call, O(1) for one band.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class UsageLimitPolicy(Protocol):
    dynamic: bool
    """Whether the ceilings depend on the saturation (else they may be cached
    per set of bands)."""

    def ceiling(self, rank: int, count: int, priorities: Sequence[int], saturation: float) -> float:
        """The ceiling of the band at `rank` (0 = highest) of `count` active
        bands (`priorities`, highest first) at `saturation`."""
        ...


class Domain(StrEnum):
    """How priority-holdback places bands between its ceilings."""

    RANK = "rank"
    VALUE = "value"


@dataclass(slots=True, frozen=True)
class StaticUsageLimit:
    """`static-usage-limit-policy`: the same ceiling for every band."""

    threshold: float = 1.0
    dynamic = False

    def ceiling(self, rank: int, count: int, priorities: Sequence[int], saturation: float) -> float:
        return self.threshold


@dataclass(slots=True, frozen=True)
class PriorityHoldback:
    """`priority-holdback-policy`: linear from `max_ceiling` (top) to
    `min_ceiling` (lowest), by rank or by priority value."""

    min_ceiling: float = 0.9
    max_ceiling: float = 1.0
    domain: Domain = Domain.RANK
    dynamic = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_ceiling < self.max_ceiling <= 1.0:
            raise ValueError(
                "priority holdback needs 0 <= minCeiling < maxCeiling <= 1, got "
                f"{self.min_ceiling} and {self.max_ceiling}"
            )

    def ceiling(self, rank: int, count: int, priorities: Sequence[int], saturation: float) -> float:
        if count <= 1:
            return self.max_ceiling
        spread = self.max_ceiling - self.min_ceiling
        if self.domain is Domain.VALUE:
            low, high = priorities[-1], priorities[0]
            if high == low:
                return self.max_ceiling
            return self.min_ceiling + (priorities[rank] - low) / (high - low) * spread
        return self.max_ceiling - rank * spread / (count - 1)


class SoftReflectiveCeiling:
    """`soft-reflective-ceiling-policy` (see the module docstring). Keeps one
    tick, advanced once per call made in the alternating regime."""

    __slots__ = ("_tick",)
    dynamic = True

    def __init__(self) -> None:
        self._tick = 0

    def __eq__(self, other: object) -> bool:
        # The tick only spreads dispatches: two of these configure the same.
        return isinstance(other, SoftReflectiveCeiling)

    def __hash__(self) -> int:
        return hash(SoftReflectiveCeiling)

    def ceiling(self, rank: int, count: int, priorities: Sequence[int], saturation: float) -> float:
        if count <= 1 or rank == 0:
            return 1.0
        if saturation < 1.0 - rank * saturation / (count - 1):
            return 1.0
        if saturation >= 1.0:
            return 0.0
        self._tick += 1
        period = max(1, round(saturation / (1.0 - saturation + 1e-9)))
        return 1.0 if self._tick % period == 0 else 0.0


DEFAULT_USAGE_LIMITS = PriorityHoldback(min_ceiling=0.9)
"""The default: the reference's holdback shape with a shallow slope; on
learned per-endpoint limits every band below the top leaves at least one
slot free (`epp.flowcontrol.adaptive.allowed`)."""
