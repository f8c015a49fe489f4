"""Configuration of the flow-control core: capacity, TTLs and per-band policies."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from epp.flowcontrol.usagelimits import DEFAULT_USAGE_LIMITS, UsageLimitPolicy

GIB = 1 << 30


class Fairness(StrEnum):
    """How a band shares dispatches between its flows."""

    ROUND_ROBIN = "round-robin"
    VTC = "vtc"
    GLOBAL_STRICT = "global-strict"
    PROGRAM_AWARE = "program-aware"


class Ordering(StrEnum):
    """Which of a flow's requests goes first."""

    FCFS = "fcfs"
    EDF = "edf"
    SLO_DEADLINE = "slo-deadline"


@dataclass(slots=True, frozen=True)
class ProgramAwareConfig:
    """The `program-aware` policy's LAS strategy (the reference's
    `program-aware-fairness` parameters): the score's weights on inverted
    attained service and on head-of-queue wait, the half-life of attained
    service (0: no decay), and when an idle program's state is dropped
    (`eviction_ttl` after its last completion, 0: never; checked every
    `eviction_sweep`). Seconds on the core's clock."""

    weight_service: float = 0.8
    weight_head_wait: float = 0.2
    half_life: float = 60.0
    eviction_ttl: float = 3600.0
    eviction_sweep: float = 300.0


@dataclass(slots=True, frozen=True)
class BandConfig:
    """One priority band. `max_requests`/`max_bytes` of 0 mean unlimited;
    `ttl` of None or 0 means the band adds no TTL of its own."""

    priority: int
    max_requests: int = 5000
    max_bytes: int = GIB
    ttl: float | None = None
    fairness: Fairness = Fairness.VTC
    ordering: Ordering = Ordering.FCFS
    input_weight: float = 1.0
    output_weight: float = 2.0
    program_aware: ProgramAwareConfig = ProgramAwareConfig()


class GateKind(StrEnum):
    """Which saturation signals close the gate."""

    CONCURRENCY = "concurrency"
    UTILIZATION = "utilization"
    ADAPTIVE = "adaptive"


@dataclass(slots=True, frozen=True)
class GateConfig:
    """The gate: any combination of kinds, all of which must be open.

    `adaptive` (the default): per-endpoint in-flight limits learned from the
    servers' own metrics, with headroom for higher bands
    (`epp.flowcontrol.adaptive`); no number to tune.
    `concurrency`: fixed in-flight credits, `max_in_flight` for the pool and
    `max_per_endpoint` for each endpoint (0 = unlimited). With `adaptive`,
    `max_per_endpoint` is the limit of an endpoint whose metrics cannot be
    read (nothing to learn from).
    `max_per_prefill_endpoint`: under prefill/decode disaggregation, the
    requests in their prefill stage per prefill endpoint (0 = unlimited;
    see `epp.scheduling.stages`); `prefill_timeout`: the longest a request
    holds its prefill credit when the decode server's response does not
    begin (seconds).
    `utilization`: the pool's saturation from scraped waiting queue and
    KV-cache usage, against the one set of saturation thresholds (the
    saturation filter's, `epp.scheduling.saturation`).
    The controller reads none of this; `build_core` builds the gate from it.
    """

    kinds: frozenset[GateKind] = frozenset({GateKind.ADAPTIVE})
    max_in_flight: int = 0
    max_per_endpoint: int = 32
    max_per_prefill_endpoint: int = 8
    prefill_timeout: float = 60.0
    usage_limits: UsageLimitPolicy = DEFAULT_USAGE_LIMITS
    """The share of each endpoint's learned limit each band may use
    (adaptive), or each band's ceiling on the detector's saturation."""
    detector: object | None = None
    """A saturation detector plugin (`flowControl.saturationDetector`); when
    set it is the whole gate and `kinds` are not read."""


@dataclass(slots=True, frozen=True)
class FlowControlConfig:
    """Global limits (0 = unlimited), the default TTL (0 disables it), the
    template for bands first seen in traffic, and the configured bands."""

    max_requests: int = 0
    max_bytes: int = 0
    default_ttl: float = 60.0
    default_band: BandConfig = field(default_factory=lambda: BandConfig(priority=0))
    default_negative_band: BandConfig | None = None
    """The template for negative (sheddable) priorities; None: `default_band`."""
    bands: tuple[BandConfig, ...] = ()
    flow_idle_timeout: float = 300.0
    gate: GateConfig = field(default_factory=GateConfig)
    no_endpoint_ttl: float | None = None
    """The queue-wait budget while the pool has no endpoint (0 disables it);
    None: `default_ttl`, as the reference's `noEndpointRequestTTL` follows
    `defaultRequestTTL` when unset."""

    @property
    def empty_pool_ttl(self) -> float:
        """The budget while the pool has no endpoint (0: none)."""
        return self.default_ttl if self.no_endpoint_ttl is None else self.no_endpoint_ttl

    def band(self, priority: int) -> BandConfig:
        """The configuration of the band for `priority`, configured or templated."""
        for band in self.bands:
            if band.priority == priority:
                return band
        template = self.default_band
        if priority < 0 and self.default_negative_band is not None:
            template = self.default_negative_band
        return replace(template, priority=priority)


def effective_ttl(*ttls: float | None) -> float | None:
    """The smallest positive TTL among those given; None when none limits."""
    best: float | None = None
    for ttl in ttls:
        if ttl is not None and ttl > 0 and (best is None or ttl < best):
            best = ttl
    return best
