"""Saturation: when an endpoint, and the pool, count as full. One rule, one
set of thresholds, every reader of them here or built on what is here.

The rule (the reference's utilization detector, `pkg/epp/framework/plugins/
flowcontrol/saturationdetector/utilization`):

- an endpoint's saturation is max(waiting / queue_depth, kv_usage /
  kv_cache); an endpoint whose metrics are stale (missing, the latest read
  failed, or older than `staleness`) counts 1.0, fail-closed (the
  utilization detector's `stalenessPolicy: ignore` leaves it out of the
  pool's mean instead);
- an endpoint is saturated at 1.0 and above;
- the pool's saturation is the unweighted mean over its endpoints; an empty
  pool is saturated (1.0).

Readers, and where their thresholds come from:

- the saturation filter (`unsaturated`; the `Scheduler` runs it before the
  profiles): keeps endpoints below 1.0. Thresholds: the `saturation-filter`
  plugin's parameters (`SchedulingConfig.saturation`), the one set;
- `UtilizationGate` (gate kind `utilization`): open while the pool is below
  1.0. Thresholds: the same set;
- the pool-saturation gauge on `/metrics` (`gate_saturation`): what the
  built gate reads, so the same set;
- `UtilizationDetector` (`epp.scheduling.detectors`): the pool against a
  band's ceiling, and as a filter endpoints below 1.0 + headroom.
  Thresholds: the `utilization-detector` plugin's parameters;
- `ProbabilisticAdmitter` (`epp.scheduling.admitters`): the pool, metrics
  never stale. Thresholds: the `probabilistic-admitter` plugin's.

The reference's two plugins keep their own parameters (that is their
interface); each holds them as a `SaturationThresholds`, so the defaults and
the rule are written once. The scraper reads `staleness` from the
saturation filter's set to decide when an unchanged read is news.

Cost: one pass over the pool per reading; the filter and the gate cache
their answer until the snapshot changes or a fresh endpoint turns stale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import inf
from typing import Protocol, runtime_checkable

from epp.flowcontrol.gate import ConcurrencyGate, Gate, gate_parts
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot


@dataclass(slots=True, frozen=True)
class SaturationThresholds:
    """When an endpoint is saturated; the defaults are the reference's."""

    queue_depth: float = 5
    """Waiting requests per endpoint."""
    kv_cache: float = 0.8
    """KV-cache usage per endpoint, a fraction."""
    staleness: float = 0.2
    """Seconds after which an endpoint's metrics are stale (inf: never)."""

    def __post_init__(self) -> None:
        if not (self.queue_depth > 0 and self.kv_cache > 0 and self.staleness >= 0):
            raise ValueError(
                "saturation thresholds must be positive (staleness not negative), got "
                f"queue depth {self.queue_depth}, KV cache {self.kv_cache}, "
                f"staleness {self.staleness}"
            )

    def endpoint_saturation(self, metrics: EndpointMetrics, now: float) -> float:
        """One endpoint's saturation at `now` (see the module docstring)."""
        if metrics.is_stale(now, self.staleness):
            return 1.0
        queue = metrics.waiting / self.queue_depth
        kv = metrics.kv_usage / self.kv_cache
        # Not max(): a builtin that parses keywords at every call on 3.11
        # (per endpoint per sample: bench.instructions).
        return kv if kv > queue else queue


DEFAULT_THRESHOLDS = SaturationThresholds()


def pool_saturation(
    pool: PoolSnapshot, now: float, thresholds: SaturationThresholds, ignore_stale: bool = False
) -> tuple[float, float]:
    """The pool's saturation at `now`, and until when it holds if no new
    snapshot comes (the moment the first fresh endpoint turns stale).

    `ignore_stale` (the reference's `stalenessPolicy: ignore`) leaves
    endpoints with stale metrics out of the mean instead of counting them
    1.0, so a pool whose every endpoint is stale reads 0.0; an empty pool is
    saturated either way."""
    endpoints = pool.endpoints
    if not endpoints:
        return 1.0, inf
    total = 0.0
    counted = 0
    valid_until = inf
    staleness = thresholds.staleness
    of = thresholds.endpoint_saturation
    for endpoint in endpoints:
        metrics = endpoint.metrics
        if not metrics.is_stale(now, staleness):
            expires = metrics.updated_at + staleness  # type: ignore[operator]
            if expires < valid_until:
                valid_until = expires
        elif ignore_stale:
            continue
        total += of(metrics, now)
        counted += 1
    return (total / counted if counted else 0.0), valid_until


def unsaturated(
    endpoints: Sequence[Endpoint],
    now: float,
    thresholds: SaturationThresholds,
    headroom: float = 0.0,
) -> tuple[list[Endpoint], float]:
    """The saturation filter: the endpoints whose saturation is below
    1.0 + `headroom` (so with fresh metrics), and until when that answer
    holds for them (the moment the first of them turns stale)."""
    kept = []
    valid_until = inf
    limit = 1.0 + headroom
    staleness = thresholds.staleness
    of = thresholds.endpoint_saturation
    for endpoint in endpoints:
        metrics = endpoint.metrics
        if of(metrics, now) < limit:
            kept.append(endpoint)
            expires = metrics.updated_at + staleness  # type: ignore[operator]
            if expires < valid_until:
                valid_until = expires
    return kept, valid_until


class UtilizationGate:
    """The gate kind `utilization`: open while the pool's saturation is
    below 1.0. It only sees what the last scrape saw, so on its own it lets a
    burst through between two scrapes; with credits beside it (adaptive or
    concurrency, which the scheduler respects) an endpoint never gets more
    than its credits allow.

    `pool` returns the latest snapshot and `clock` the time on the snapshot's
    clock. The saturation is recomputed only when the snapshot changes, a
    fresh endpoint turns stale, or the thresholds change (`retune`).
    """

    __slots__ = ("_clock", "_pool", "_saturation", "_valid_until", "_version", "thresholds")

    def __init__(
        self,
        pool: Callable[[], PoolSnapshot],
        clock: Callable[[], float],
        thresholds: SaturationThresholds = DEFAULT_THRESHOLDS,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self.thresholds = thresholds
        self._version: int | None = None
        self._saturation = 1.0
        self._valid_until = -inf

    def retune(self, thresholds: SaturationThresholds) -> None:
        """Read the pool against `thresholds` from now on (a reload)."""
        self.thresholds = thresholds
        self._version = None

    def saturation(self) -> float:
        """The pool's saturation now: 0 idle, 1.0 and above saturated."""
        pool = self._pool()
        now = self._clock()
        if pool.version != self._version or now > self._valid_until:
            self._saturation, self._valid_until = pool_saturation(pool, now, self.thresholds)
            self._version = pool.version
        return self._saturation

    def is_open(self, priority: int) -> bool:
        return self.saturation() < 1.0

    def on_dispatch(self, request: FlowRequest) -> None:
        pass

    def on_complete(self, request: FlowRequest) -> None:
        pass


@runtime_checkable
class ReadsSaturation(Protocol):
    """A gate that knows the pool's saturation as it sees it (utilization,
    adaptive, a configured detector)."""

    def saturation(self) -> float: ...


def gate_saturation(gate: Gate, pool: PoolSnapshot) -> float:
    """The pool's saturation as `gate` sees it, for the pool-saturation
    gauge: the largest of its parts' readings (fixed credits: in flight over
    the pool's and the endpoints' limits), 0 when no part reads one. An
    empty pool is saturated."""
    if not pool.endpoints:
        return 1.0
    values = [0.0]
    for part in gate_parts(gate):
        if isinstance(part, ReadsSaturation):
            values.append(part.saturation())
        elif isinstance(part, ConcurrencyGate):
            if part.max_per_endpoint > 0:
                values.append(part.in_flight / (part.max_per_endpoint * len(pool.endpoints)))
            if part.max_in_flight > 0:
                values.append(part.in_flight / part.max_in_flight)
    return max(values)
