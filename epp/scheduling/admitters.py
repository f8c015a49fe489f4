"""Admitters: plugins that may refuse a request before it is scheduled.

`ProbabilisticAdmitter` is the reference's `probabilistic-admitter`: a
request with priority >= 0 is always admitted; a sheddable one (priority < 0)
is refused with probability min(saturation ** power * k, 1.0), where the
saturation is the pool's by the rule of `epp.scheduling.saturation` (mean
of max(waiting / queueDepthThreshold, kv_usage / kvCacheUtilThreshold); an
endpoint without metrics counts 1.0, and metrics are never stale to it, as
in the reference). An empty pool admits. The caller draws the random number so that
the plugin stays a plain value and a test can choose the draw.

The core runs the configured admitters in declaration order (`Core.screen`)
when a request is complete, before flow control, live and in the simulator;
a refusal ends the request with 500 (the reference's `Internal` code) and no
dropped-reason header (the simulator: outcome `admission-denied`). Cost: one
pass over the pool's endpoints per sheddable request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import inf

from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.saturation import DEFAULT_THRESHOLDS, SaturationThresholds, pool_saturation

NEVER_STALE = replace(DEFAULT_THRESHOLDS, staleness=inf)
"""The reference's thresholds; the admitter reads metrics of any age."""


@dataclass(slots=True, frozen=True)
class ProbabilisticAdmitter:
    thresholds: SaturationThresholds = NEVER_STALE
    power: float = 5.0
    k: float = 300.0

    def shed_probability(self, pool: PoolSnapshot, now: float) -> tuple[float, float]:
        """(saturation, probability of refusing a sheddable request)."""
        saturation, _ = pool_saturation(pool, now, self.thresholds)
        return saturation, min(saturation**self.power * self.k, 1.0)

    def deny(self, priority: int, pool: PoolSnapshot, now: float, draw: float) -> str | None:
        """Why a request is refused (None: admitted); `draw` is uniform in [0, 1)."""
        if priority >= 0 or not pool.endpoints:
            return None
        saturation, probability = self.shed_probability(pool, now)
        if draw < probability:
            return (
                f"probabilistic-admitter: rejected, saturation={saturation:.3f} "
                f"prob={probability:.2f}"
            )
        return None
