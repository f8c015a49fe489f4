"""Gates built from the pool's metrics, and the builder of the configured gate.

`UtilizationGate` is the reference EPP's utilization detector: each endpoint's
saturation is max(waiting / queue_depth_threshold, kv_usage / kv_cache_threshold),
an endpoint with stale or missing metrics counts as 1.0 (saturated), the pool's
saturation is the unweighted mean, and an empty pool is saturated. It only
sees what the last scrape saw, so on its own it lets a burst through between
two scrapes; combined with the `ConcurrencyGate` (whose per-endpoint credits
the scheduler respects) an endpoint never gets more than its credits allow.
"""

from __future__ import annotations

from collections.abc import Callable

from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.config import GateConfig, GateKind
from epp.flowcontrol.gate import AllGates, ConcurrencyGate, Credits, Gate, OpenGate
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.endpoint import PoolSnapshot


def pool_saturation(
    pool: PoolSnapshot,
    now: float,
    queue_depth_threshold: float,
    kv_cache_threshold: float,
    staleness: float,
) -> tuple[float, float]:
    """The pool's saturation at `now`, and until when it holds if no new
    snapshot comes (the moment the first fresh endpoint turns stale)."""
    endpoints = pool.endpoints
    if not endpoints:
        return 1.0, float("inf")
    total = 0.0
    valid_until = float("inf")
    for endpoint in endpoints:
        metrics = endpoint.metrics
        if metrics.is_stale(now, staleness):
            total += 1.0
            continue
        total += max(metrics.waiting / queue_depth_threshold, metrics.kv_usage / kv_cache_threshold)
        expires = metrics.updated_at + staleness
        if expires < valid_until:
            valid_until = expires
    return total / len(endpoints), valid_until


class UtilizationGate:
    """Open while the pool's saturation is below 1.0 (see the module docstring).

    `pool` returns the latest snapshot and `clock` the time on the snapshot's
    clock. The saturation is recomputed only when the snapshot changes or a
    fresh endpoint turns stale.
    """

    __slots__ = (
        "_clock",
        "_pool",
        "_saturation",
        "_valid_until",
        "_version",
        "kv_cache_threshold",
        "queue_depth_threshold",
        "staleness",
    )

    def __init__(
        self,
        pool: Callable[[], PoolSnapshot],
        clock: Callable[[], float],
        queue_depth_threshold: float = 5.0,
        kv_cache_threshold: float = 0.8,
        staleness: float = 0.2,
    ) -> None:
        if queue_depth_threshold <= 0 or kv_cache_threshold <= 0:
            raise ValueError(
                "utilization thresholds must be positive, got queue depth "
                f"{queue_depth_threshold} and KV cache {kv_cache_threshold}"
            )
        self._pool = pool
        self._clock = clock
        self.queue_depth_threshold = queue_depth_threshold
        self.kv_cache_threshold = kv_cache_threshold
        self.staleness = staleness
        self._version: int | None = None
        self._saturation = 1.0
        self._valid_until = float("-inf")

    def saturation(self) -> float:
        """The pool's saturation now: 0 idle, 1.0 and above saturated."""
        pool = self._pool()
        now = self._clock()
        if pool.version != self._version or now > self._valid_until:
            self._saturation, self._valid_until = pool_saturation(
                pool, now, self.queue_depth_threshold, self.kv_cache_threshold, self.staleness
            )
            self._version = pool.version
        return self._saturation

    def is_open(self, priority: int) -> bool:
        return self.saturation() < 1.0

    def on_dispatch(self, request: FlowRequest) -> None:
        pass

    def on_complete(self, request: FlowRequest) -> None:
        pass


def build_gate(
    config: GateConfig, pool: Callable[[], PoolSnapshot], clock: Callable[[], float]
) -> tuple[Gate, Credits | None]:
    """The gate `config` asks for, and its per-endpoint credits for the
    scheduler (None when neither the adaptive nor the concurrency kind is
    on; with both, the adaptive limits are the per-endpoint ones and the
    concurrency kind adds its pool-wide `max_in_flight`). No kinds at all
    gives a gate that never closes. A configured detector replaces all of
    it (`epp.scheduling.detectors`)."""
    if config.detector is not None:
        # Imported here: the detectors read this module's pool_saturation.
        from epp.scheduling.detectors import DetectorGate

        detector_gate = DetectorGate(config.detector, pool, clock, config.usage_limits)  # type: ignore[arg-type]
        return detector_gate, detector_gate
    gates: list[Gate] = []
    credits: Credits | None = None
    if GateKind.ADAPTIVE in config.kinds:
        adaptive = AdaptiveGate(
            pool, clock, usage=config.usage_limits, blind_limit=config.max_per_endpoint
        )
        gates.append(adaptive)
        credits = adaptive
    if GateKind.CONCURRENCY in config.kinds:
        concurrency = ConcurrencyGate(
            config.max_in_flight, 0 if credits is not None else config.max_per_endpoint
        )
        gates.append(concurrency)
        credits = credits or concurrency
    if GateKind.UTILIZATION in config.kinds:
        gates.append(
            UtilizationGate(
                pool,
                clock,
                config.queue_depth_threshold,
                config.kv_cache_threshold,
                config.metrics_staleness,
            )
        )
    if not gates:
        return OpenGate(), None
    if len(gates) == 1:
        return gates[0], credits
    return AllGates(gates), credits
