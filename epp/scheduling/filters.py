"""Filters: narrow the candidate endpoints before scoring. (The saturation
filter, `unsaturated`, lives with its rule in `epp.scheduling.saturation`.)

A filter may also learn where requests went (`picked`, as a scorer):
the prefix-cache affinity filter records prompts in the prefix index when
no prefix-cache scorer keeps one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from epp.flowcontrol.gate import Credits
from epp.scheduling.cache_scorers import PrefixCacheScorer, prefix_cache_scorer
from epp.scheduling.endpoint import Endpoint
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.request import InferenceRequest
from epp.scheduling.spec import BuildContext


def in_subset(endpoints: Sequence[Endpoint], subset: frozenset[str]) -> list[Endpoint]:
    """Envoy's subset hint: only endpoints whose IP is listed (ports are ignored)."""
    return [endpoint for endpoint in endpoints if endpoint.ip in subset]


def with_room(
    endpoints: Sequence[Endpoint], credits: Credits, priority: int = 0
) -> Sequence[Endpoint]:
    """Only endpoints that still have an in-flight credit for band `priority`."""
    return credits.with_room(endpoints, priority)


def reachable(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Only endpoints whose latest metrics read did not fail: alive, even if
    saturated or not read lately."""
    return [endpoint for endpoint in endpoints if not endpoint.metrics.failing]


ROLE_LABEL = "llm-d.ai/role"
"""The pod label that says which disaggregation stages a pod serves."""

DECODE_ROLES = frozenset({"decode", "prefill-decode", "encode-prefill-decode", "both"})
PREFILL_ROLES = frozenset(
    {"prefill", "encode-prefill", "prefill-decode", "encode-prefill-decode", "both"}
)
ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


class LabelFilter:
    """Keeps the endpoints whose labels satisfy `keep(labels)`. The answer
    for the latest candidate sequence is kept: candidates are immutable and
    the scheduler passes the same sequence while the pool does not change."""

    __slots__ = ("_candidates", "_kept", "keep")

    def __init__(self, keep: Callable[[Mapping[str, str]], bool]) -> None:
        self.keep = keep
        self._candidates: Sequence[Endpoint] | None = None
        self._kept: Sequence[Endpoint] = ()

    def filter(self, request: object, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        if endpoints is not self._candidates:
            keep = self.keep
            kept = [endpoint for endpoint in endpoints if keep(endpoint.labels)]
            self._kept = endpoints if len(kept) == len(endpoints) else kept
            self._candidates = endpoints
        return self._kept


def role_filter(roles: frozenset[str], unlabelled: bool) -> LabelFilter:
    """Keeps endpoints whose `llm-d.ai/role` is one of `roles`; endpoints
    without the label are kept when `unlabelled` (decode), else dropped."""

    def keep(labels: Mapping[str, str]) -> bool:
        role = labels.get(ROLE_LABEL)
        return unlabelled if role is None else role in roles

    return LabelFilter(keep)


def selector_matches(
    labels: Mapping[str, str],
    match_labels: Mapping[str, str],
    expressions: Sequence[tuple[str, str, frozenset[str]]],
) -> bool:
    """A Kubernetes label selector: every label pair and every
    (key, operator, values) requirement must hold."""
    for key, value in match_labels.items():
        if labels.get(key) != value:
            return False
    for key, operator, values in expressions:
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


# -- factories (the registry's filter types build through these) --


def decode_filter(context: BuildContext) -> LabelFilter:
    return role_filter(DECODE_ROLES, unlabelled=True)


def prefill_filter(context: BuildContext) -> LabelFilter:
    return role_filter(PREFILL_ROLES, unlabelled=False)


def encode_filter(context: BuildContext) -> LabelFilter:
    return role_filter(ENCODE_ROLES, unlabelled=False)


def label_selector_filter(
    context: BuildContext,
    match_labels: tuple[tuple[str, str], ...] = (),
    expressions: tuple[tuple[str, str, frozenset[str]], ...] = (),
) -> LabelFilter:
    wanted = dict(match_labels)
    return LabelFilter(lambda labels: selector_matches(labels, wanted, expressions))


def by_label_filter(
    context: BuildContext, label: str, valid_values: frozenset[str], allows_no_label: bool
) -> LabelFilter:
    def keep(labels: Mapping[str, str]) -> bool:
        value = labels.get(label)
        return allows_no_label if value is None else value in valid_values

    return LabelFilter(keep)


class UtilizationMetric(StrEnum):
    ACTIVE_REQUESTS = "active-requests"
    """Requests this EPP has in flight there (running or queued)."""
    RUNNING_REQUESTS = "running-requests"
    WAITING_QUEUE = "waiting-queue"
    KV_CACHE_UTILIZATION = "kv-cache-utilization"


class UtilizationFilter:
    """Keeps the endpoints whose every metric is at most its cap (the
    reference's utilization-filter); with `fallback_on_empty`, all of them
    when none is. Metrics the endpoint does not report read 0."""

    __slots__ = ("_load", "conditions", "fallback_on_empty")

    def __init__(
        self,
        conditions: Sequence[tuple[UtilizationMetric, float]],
        fallback_on_empty: bool,
        load: InFlightLoad | None,
    ) -> None:
        self.conditions = tuple(conditions)
        self.fallback_on_empty = fallback_on_empty
        self._load = load

    def filter(self, request: object, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        kept = [endpoint for endpoint in endpoints if self._fits(endpoint)]
        if not kept and self.fallback_on_empty:
            return endpoints
        return kept

    def _fits(self, endpoint: Endpoint) -> bool:
        metrics = endpoint.metrics
        for metric, cap in self.conditions:
            if metric is UtilizationMetric.ACTIVE_REQUESTS:
                value: float = self._load.requests_at(endpoint.address) if self._load else 0
            elif metric is UtilizationMetric.RUNNING_REQUESTS:
                value = metrics.running
            elif metric is UtilizationMetric.WAITING_QUEUE:
                value = metrics.waiting
            else:
                value = metrics.kv_usage
            if value > cap:
                return False
        return True


PREFIX_INDEX = "approx-prefix-cache-producer (prefix index)"
"""The built name of a prefix index a filter made because no prefix-cache
scorer was built before it; later prefix scorers share it."""


@dataclass(slots=True, eq=False)
class PrefixCacheAffinityFilter:
    """Narrows the candidates to the sticky ones, whose cached prefix is at
    least `threshold` of the prompt's blocks (the reference's
    prefix-cache-affinity-filter). Keeps them all when none is sticky, with
    probability `exploration`, or when the least loaded sticky endpoint's
    estimated TTFT (prompt tokens in flight / `peak_prefill_throughput`)
    exceeds the least loaded other one's by more than `max_ttft_penalty_ms`
    (0: always stick)."""

    prefix: PrefixCacheScorer
    load: InFlightLoad
    rng: random.Random
    threshold: float = 0.8
    exploration: float = 0.0
    max_ttft_penalty_ms: float = 18000.0
    peak_prefill_throughput: float = 15928.0
    learns: bool = False
    """Whether this filter records the prompts (it made the prefix index)."""

    def filter(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if len(endpoints) <= 1 or self.threshold <= 0:
            return endpoints
        if self.exploration and self.rng.random() < self.exploration:
            return endpoints
        matched = self.prefix.matches(request)
        if not matched:
            return endpoints
        needed = self.threshold * len(self.prefix.hashes(request))
        sticky = [e for e in endpoints if matched.get(e.address, 0) >= needed]
        if not sticky:
            return endpoints
        if self.max_ttft_penalty_ms > 0 and len(sticky) < len(endpoints):
            tokens_at = self.load.tokens_at
            others = [e for e in endpoints if matched.get(e.address, 0) < needed]
            best_sticky = min(tokens_at(e.address) for e in sticky)
            best_other = min(tokens_at(e.address) for e in others)
            penalty_ms = (best_sticky - best_other) / self.peak_prefill_throughput * 1000.0
            if penalty_ms > self.max_ttft_penalty_ms:
                return endpoints
        return sticky

    def picked(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        if self.learns:
            self.prefix.picked(request, endpoint)


def utilization_filter(
    context: BuildContext,
    conditions: tuple[tuple[str, float], ...] = (),
    fallback_on_empty: bool = False,
) -> UtilizationFilter:
    metrics = [(UtilizationMetric(metric), cap) for metric, cap in conditions]
    load = (
        context.in_flight_load()
        if any(metric is UtilizationMetric.ACTIVE_REQUESTS for metric, _ in metrics)
        else None
    )
    return UtilizationFilter(metrics, fallback_on_empty, load)


def prefix_cache_affinity_filter(
    context: BuildContext,
    threshold: float = 0.8,
    exploration: float = 0.0,
    max_ttft_penalty_ms: float = 18000.0,
    peak_prefill_throughput: float = 15928.0,
) -> PrefixCacheAffinityFilter:
    """Reads the prefix index of the prefix-cache scorers; when none was
    built yet, makes it (and records the prompts in it)."""
    prefix = context.first(PrefixCacheScorer)
    learns = prefix is None
    if prefix is None:
        prefix = context.built[PREFIX_INDEX] = prefix_cache_scorer(context)
    return PrefixCacheAffinityFilter(
        prefix,
        context.in_flight_load(),
        context.rng,
        threshold,
        exploration,
        max_ttft_penalty_ms,
        peak_prefill_throughput,
        learns,
    )
