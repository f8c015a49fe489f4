"""Saturation detectors: the reference's `utilization-detector` and
`concurrency-detector`, and `DetectorGate`, the gate that dispatches by one.

A detector named by `flowControl.saturationDetector.pluginRef` replaces the
adaptive gate, as it does in the reference's flow controller: a band may
dispatch while the pool's saturation is below its ceiling from the usage-limit
policy (`static-usage-limit-policy` 1.0 unless `usageLimitPolicyPluginRef`
names another), so at 1.0 every band waits (strict priority, no band below
a closed one goes first). Each detector also has the reference's filter role,
which `DetectorGate` gives the scheduler as per-endpoint credits
(`has_room`/`with_room`): an endpoint is held back once its load reaches the
ideal limit times (1 + headroom).

- `UtilizationDetector`: the pool's saturation by the rule of
  `epp.scheduling.saturation` (mean over endpoints of max(waiting /
  queueDepthThreshold, KV use / kvCacheUtilThreshold), stale or missing
  metrics count 1.0, an empty pool is saturated), against its own
  parameters. Its filter keeps endpoints whose saturation is below
  1.0 + headroom, or all of them when none is (the reference's fallback).
- `ConcurrencyDetector`: counts what this EPP has in flight per endpoint
  (requests, and tokens as the request's input-token estimate).
  `requests`: in flight over endpoints x maxConcurrency; `tokens`: the same
  in tokens; `hybrid`: the mean over endpoints of the larger of the two
  ratios. Its filter has no fallback: a request waits for an endpoint.
- `MaxSaturationDetector`: the largest reading of the detectors it names,
  per stage when the pool is split into prefill and decode endpoints.

Cost: one pass over the pool per saturation read; the utilization reading is
cached until the snapshot changes or a fresh endpoint turns stale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from math import inf
from typing import Protocol, TypeVar

from epp.flowcontrol.request import FlowRequest
from epp.flowcontrol.usagelimits import StaticUsageLimit, UsageLimitPolicy
from epp.scheduling.endpoint import Endpoint, PoolSnapshot
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.saturation import DEFAULT_THRESHOLDS, SaturationThresholds, pool_saturation
from epp.scheduling.spec import BuildContext
from epp.scheduling.stages import PREFILL, endpoint_stages, stage_pools


class Load(Protocol):
    """Per endpoint address: (requests, tokens) this EPP has in flight there."""

    def get(self, address: str, default: tuple[int, int], /) -> tuple[int, int]: ...


E = TypeVar("E")


class SaturationDetector(Protocol):
    def saturation(self, pool: PoolSnapshot, now: float, load: Load) -> tuple[float, float]:
        """The pool's saturation (1.0 = full), and until when it holds for
        this snapshot and load."""
        ...

    def admits(self, endpoint: Endpoint, now: float, load: Load) -> bool:
        """The filter role: whether `endpoint` may take one more request."""
        ...

    falls_back: bool
    """Whether the filter passes every endpoint when it would pass none."""


@dataclass(slots=True, frozen=True)
class UtilizationDetector:
    thresholds: SaturationThresholds = DEFAULT_THRESHOLDS
    headroom: float = 0.0
    ignore_stale: bool = False
    """`stalenessPolicy: ignore`: stale endpoints are left out of the pool's mean."""
    falls_back = True

    def saturation(self, pool: PoolSnapshot, now: float, load: Load) -> tuple[float, float]:
        return pool_saturation(pool, now, self.thresholds, self.ignore_stale)

    def admits(self, endpoint: Endpoint, now: float, load: Load) -> bool:
        # The reference's waiting < queueDepthThreshold * (1 + headroom)
        # and the same for KV, said as one saturation below 1 + headroom.
        return self.thresholds.endpoint_saturation(endpoint.metrics, now) < 1.0 + self.headroom


class ConcurrencyMode(StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"
    HYBRID = "hybrid"


@dataclass(slots=True, frozen=True)
class ConcurrencyDetector:
    mode: ConcurrencyMode = ConcurrencyMode.REQUESTS
    max_concurrency: int = 100
    max_token_concurrency: int = 1_000_000
    headroom: float = 0.0
    falls_back = False

    def saturation(self, pool: PoolSnapshot, now: float, load: Load) -> tuple[float, float]:
        endpoints = pool.endpoints
        if not endpoints:
            return 1.0, inf
        requests = tokens = 0
        hybrid = 0.0
        for endpoint in endpoints:
            r, t = load.get(endpoint.address, (0, 0))
            requests += r
            tokens += t
            hybrid += max(r / self.max_concurrency, t / self.max_token_concurrency)
        count = len(endpoints)
        if self.mode is ConcurrencyMode.TOKENS:
            return tokens / (count * self.max_token_concurrency), inf
        if self.mode is ConcurrencyMode.HYBRID:
            return hybrid / count, inf
        return requests / (count * self.max_concurrency), inf

    def admits(self, endpoint: Endpoint, now: float, load: Load) -> bool:
        requests, tokens = load.get(endpoint.address, (0, 0))
        burst = 1.0 + self.headroom
        # The reference truncates the limits to whole numbers.
        fits_requests = requests < int(self.max_concurrency * burst)
        fits_tokens = tokens < int(self.max_token_concurrency * burst)
        if self.mode is ConcurrencyMode.TOKENS:
            return fits_tokens
        if self.mode is ConcurrencyMode.HYBRID:
            return fits_requests and fits_tokens
        return fits_requests


@dataclass(slots=True, frozen=True)
class MaxSaturationDetector:
    """The reference's `max-saturation-detector`: the largest of its
    children's readings. `stages[i]` is the stages child i is read for
    (empty: every stage). When the pool has prefill endpoints (it is split by
    stage, as `stage_pools` splits it), each stage reads the children in its
    scope over that stage's endpoints, a stage with none in scope reads 0,
    and the pool's saturation is the larger stage's; otherwise every child
    reads the whole pool. The filter role: an endpoint is admitted when every
    child in scope of its stages admits it; it passes every endpoint when it
    would pass none only if every child does (the reference applies each
    child's filter in turn, each with its own fallback)."""

    children: tuple[SaturationDetector, ...]
    stages: tuple[frozenset[str], ...]

    def __post_init__(self) -> None:
        if not self.children or len(self.stages) != len(self.children):
            raise ValueError("a max-saturation-detector needs one stage scope per child")

    @property
    def falls_back(self) -> bool:  # type: ignore[override]
        return all(child.falls_back for child in self.children)

    def saturation(self, pool: PoolSnapshot, now: float, load: Load) -> tuple[float, float]:
        parts = stage_pools(pool)
        if PREFILL not in parts:
            return self._max(range(len(self.children)), pool, now, load)
        value, valid_until = 0.0, inf
        for stage, part in parts.items():
            scoped = [i for i, scope in enumerate(self.stages) if not scope or stage in scope]
            reading, until = self._max(scoped, part, now, load)
            value, valid_until = max(value, reading), min(valid_until, until)
        return value, valid_until

    def _max(
        self, indices: Sequence[int] | range, pool: PoolSnapshot, now: float, load: Load
    ) -> tuple[float, float]:
        value, valid_until = 0.0, inf
        for i in indices:
            reading, until = self.children[i].saturation(pool, now, load)
            value, valid_until = max(value, reading), min(valid_until, until)
        return value, valid_until

    def admits(self, endpoint: Endpoint, now: float, load: Load) -> bool:
        stages = endpoint_stages(endpoint)
        return all(
            child.admits(endpoint, now, load)
            for child, scope in zip(self.children, self.stages, strict=True)
            if not scope or scope & stages
        )


class _InFlightView:
    """`InFlightLoad` read as a detector's `Load`."""

    __slots__ = ("_load",)

    def __init__(self, load: InFlightLoad) -> None:
        self._load = load

    def get(self, address: str, default: tuple[int, int], /) -> tuple[int, int]:
        load = self._load
        return load.requests_at(address), load.tokens_at(address)


class DetectorFilter:
    """A detector's filter role where a scheduling profile lists the detector
    (the reference's detectors are profile filters too): keeps the endpoints
    it admits, counting what this EPP has in flight, and every endpoint when
    it would keep none if the detector falls back."""

    __slots__ = ("_clock", "_load", "detector")

    def __init__(
        self, detector: SaturationDetector, load: InFlightLoad, clock: Callable[[], float]
    ) -> None:
        self.detector = detector
        self._load = _InFlightView(load)
        self._clock = clock

    def filter(self, request: object, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        now, load, admits = self._clock(), self._load, self.detector.admits
        kept = [endpoint for endpoint in endpoints if admits(endpoint, now, load)]
        if not kept and self.detector.falls_back:
            return endpoints
        return kept


def detector_filter(context: BuildContext, detector: SaturationDetector) -> DetectorFilter:
    """The profile filter of a detector a profile lists."""
    return DetectorFilter(detector, context.in_flight_load(), context.clock)


class DetectorGate:
    """The gate and per-endpoint credits of a configured detector (see the
    module docstring). Bands are learned from the priorities asked about."""

    __slots__ = (
        "_addresses",
        "_charged",
        "_clock",
        "_load",
        "_pool",
        "_priorities",
        "_saturation",
        "_valid_until",
        "_version",
        "detector",
        "in_flight",
        "usage",
    )

    def __init__(
        self,
        detector: SaturationDetector,
        pool: Callable[[], PoolSnapshot],
        clock: Callable[[], float],
        usage: UsageLimitPolicy | None = None,
    ) -> None:
        self.detector = detector
        self.usage = usage or StaticUsageLimit()
        self._pool = pool
        self._clock = clock
        self._load: dict[str, tuple[int, int]] = {}
        self._charged: dict[FlowRequest, int] = {}
        self._priorities: list[int] = []
        self._version: int | None = None
        self._addresses: dict[str, Endpoint] = {}
        self._saturation = 1.0
        self._valid_until = -inf
        self.in_flight = 0

    def saturation(self) -> float:
        pool = self._pool()
        now = self._clock()
        if pool.version != self._version or now > self._valid_until:
            self._version = pool.version
            self._addresses = {endpoint.address: endpoint for endpoint in pool.endpoints}
            self._saturation, self._valid_until = self.detector.saturation(pool, now, self._load)
        return self._saturation

    # -- the Gate protocol ---------------------------------------------------

    def is_open(self, priority: int) -> bool:
        priorities = self._priorities
        if priority not in priorities:
            priorities.append(priority)
            priorities.sort(reverse=True)
        saturation = self.saturation()
        rank = priorities.index(priority)
        return saturation < self.usage.ceiling(rank, len(priorities), priorities, saturation)

    def on_dispatch(self, request: FlowRequest) -> None:
        self.in_flight += 1
        self._change(request, 1)

    def on_complete(self, request: FlowRequest) -> None:
        self.in_flight -= 1
        self._change(request, -1)

    # -- the Credits protocol -------------------------------------------------

    def has_room(self, endpoint: str, priority: int = 0) -> bool:
        self.saturation()  # refreshes the address map
        known = self._addresses.get(endpoint)
        if known is None:
            return False
        return self.detector.admits(known, self._clock(), self._load)

    def with_room(self, endpoints: Sequence[E], priority: int = 0) -> Sequence[E]:
        now = self._clock()
        self.saturation()
        addresses, load, admits = self._addresses, self._load, self.detector.admits
        kept = [
            endpoint
            for endpoint in endpoints
            if (known := addresses.get(endpoint.address)) is not None  # type: ignore[attr-defined]
            and admits(known, now, load)
        ]
        if not kept and self.detector.falls_back:
            return endpoints
        return kept

    def may_have_room(self, endpoints: Sequence[object], priority: int = 0) -> bool:
        return True

    def in_flight_at(self, endpoint: str) -> int:
        """Requests this EPP has in flight at `endpoint` (active-request-scorer)."""
        return self._load.get(endpoint, (0, 0))[0]

    def _change(self, request: FlowRequest, sign: int) -> None:
        endpoint = request.endpoint
        if endpoint is None:
            return
        # The tokens counted at dispatch are the ones taken back (the
        # completion may correct the request's estimate first).
        if sign > 0:
            charge = self._charged[request] = request.input_tokens or 0
        else:
            charge = self._charged.pop(request, 0)
        requests, tokens = self._load.get(endpoint, (0, 0))
        requests += sign
        tokens += sign * charge
        if requests:
            self._load[endpoint] = (requests, tokens)
        else:
            self._load.pop(endpoint, None)
        self._valid_until = -inf  # the load changed: read the saturation again
