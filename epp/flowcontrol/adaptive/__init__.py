"""Adaptive per-endpoint in-flight limits, with headroom for higher bands.

No fixed number fits every pool: a server that batches 8 is flooded by 32
credits, one that batches 256 is starved by them. So each endpoint's limit
is learned from what the server itself reports at every scrape (requests
running and waiting), and the in-flight credits (taken at dispatch, given
back at completion) keep holding between scrapes, so nothing overshoots.
The law, rule by rule, is in this package's README
(`epp/flowcontrol/README.md`, "The adaptive gate").

Parts:
- `inputs`: what it reads (`Sample`, `Observed`, `Observations`) and its
  settings (`AdaptiveLimits`).
- `estimator`: `LimitEstimator`, one endpoint's limit and pending budget,
  fed each fresh sample (pure: the sample's timestamp is its clock), and
  `fits`, the room a band below the top finds there.
- `latency`: `LatencySignal`, an endpoint's recent inter-token latency
  (histogram buckets' median, mean, responses) and its reference against
  the pool's (`compare_to_pool`).
- `gate`: `AdaptiveGate`, the `Gate` and the scheduler's per-endpoint
  `Credits`: it reads the pool snapshot when its version moves (one pass
  over the endpoints per snapshot, none per request), keeps one estimator
  per endpoint and answers `has_room(endpoint, priority)` with the
  usage-limit policy (`epp.flowcontrol.usagelimits`) applied to the
  learned limit.

Cost: `has_room` O(1) (dict lookups), O(endpoints) for a top-band request
whose chosen endpoint has requests pending, once per change of the pool or
of the in-flight counts; a new snapshot O(E log E) for E endpoints (the
latency comparison sorts them; the probes under way are counted in O(E));
a sample's latency O(1) amortized plus its median's, which walks the
buckets up to the median's; a response's O(1).
"""

from epp.flowcontrol.adaptive.estimator import (
    INTAKE,
    KEEP_PACE,
    KV_FULL,
    LONG_STEP,
    NOT_FULL,
    PREFILLING,
    QUEUED_THROUGHOUT,
    SHRINK,
    STEP_ARRIVALS,
    LimitEstimator,
    allowed,
    fits,
)
from epp.flowcontrol.adaptive.gate import PROBE_SHARE, AdaptiveGate
from epp.flowcontrol.adaptive.inputs import AdaptiveLimits, Observations, Observed, Sample
from epp.flowcontrol.adaptive.latency import (
    LATENCY_SAMPLES,
    LATENCY_WEIGHT,
    RECENT_SECONDS,
    RECENT_WINDOW,
    REFERENCE_SECONDS,
    REFERENCE_SPAN,
    LatencySignal,
    compare_to_pool,
    median_grown,
    median_without,
)

__all__ = [
    "INTAKE",
    "KEEP_PACE",
    "KV_FULL",
    "LATENCY_SAMPLES",
    "LATENCY_WEIGHT",
    "LONG_STEP",
    "NOT_FULL",
    "PREFILLING",
    "PROBE_SHARE",
    "QUEUED_THROUGHOUT",
    "RECENT_SECONDS",
    "RECENT_WINDOW",
    "REFERENCE_SECONDS",
    "REFERENCE_SPAN",
    "SHRINK",
    "STEP_ARRIVALS",
    "AdaptiveGate",
    "AdaptiveLimits",
    "LatencySignal",
    "LimitEstimator",
    "Observations",
    "Observed",
    "Sample",
    "allowed",
    "compare_to_pool",
    "fits",
    "median_grown",
    "median_without",
]
