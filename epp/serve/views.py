"""What the metrics page reads from the store, the core and the configuration
at scrape time: each stage's saturation, the stale endpoints, the queued
requests by the stage that holds them, and the credits in use per stage.

Nothing here is written on the request path; every view is computed when
`/metrics` is read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from epp.datalayer.store import EndpointStore
from epp.scheduling.core import Core
from epp.scheduling.saturation import SaturationThresholds, pool_saturation
from epp.scheduling.stages import DECODE, PREFILL, stage_pools
from epp.serve.metrics import StageView


@dataclass(slots=True, frozen=True)
class PoolViews:
    """The scrape-time views of one live EPP's store and core."""

    store: EndpointStore
    core: Core
    thresholds: Callable[[], SaturationThresholds]
    """The saturation filter's thresholds of the configuration now."""

    def stage_view(self) -> StageView:
        return StageView(self.stage_saturation, self.stale_endpoints, self.queued_by_stage)

    def stage_saturation(self) -> dict[str, float]:
        """Each stage's saturation: the saturation rule over its endpoints,
        with the saturation filter's thresholds."""
        now = time.monotonic()
        thresholds = self.thresholds()
        return {
            stage: pool_saturation(part, now, thresholds)[0]
            for stage, part in stage_pools(self.store.snapshot()).items()
        }

    def stale_endpoints(self) -> tuple[str, int]:
        """The endpoints the saturation filter counts stale (and saturated)."""
        now = time.monotonic()
        staleness = self.thresholds().staleness
        endpoints = self.store.snapshot().endpoints
        return "saturation-filter", sum(e.metrics.is_stale(now, staleness) for e in endpoints)

    def queued_by_stage(self) -> dict[str, int]:
        """The queued requests under the stage that holds them: the one the
        scheduler last waited for, else the gate (`effective`)."""
        core = self.core
        stages = dict.fromkeys(
            (DECODE, PREFILL, "effective")
            if core.prefill_credits is not None
            else (DECODE, "effective"),
            0,
        )
        queued = core.queued_requests
        if queued:
            stages[core.scheduler.waiting_for or "effective"] = queued
        return stages

    def credits_in_use(self) -> dict[str, int]:
        """The credits taken per stage (`decode`, `prefill` under P/D)."""
        stages: dict[str, int] = {}
        credits, prefill = self.core.credits, self.core.prefill_credits
        if credits is not None:
            stages["decode"] = credits.in_flight
        if prefill is not None:
            stages["prefill"] = prefill.in_flight
        return stages
