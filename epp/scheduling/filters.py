"""Filters: narrow the candidate endpoints before scoring."""

from __future__ import annotations

from collections.abc import Sequence

from epp.flowcontrol.gate import ConcurrencyGate
from epp.scheduling.endpoint import Endpoint


def in_subset(endpoints: Sequence[Endpoint], subset: frozenset[str]) -> list[Endpoint]:
    """Envoy's subset hint: only endpoints whose IP is listed (ports are ignored)."""
    return [endpoint for endpoint in endpoints if endpoint.ip in subset]


def with_room(endpoints: Sequence[Endpoint], gate: ConcurrencyGate) -> Sequence[Endpoint]:
    """Only endpoints that still have an in-flight credit. While the whole
    pool holds fewer requests than one endpoint's limit, none can be full."""
    limit = gate.max_per_endpoint
    if limit <= 0 or gate.in_flight < limit:
        return endpoints
    has_room = gate.has_room
    return [endpoint for endpoint in endpoints if has_room(endpoint.address)]


def reachable(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Only endpoints whose latest metrics read did not fail: alive, even if
    saturated or not read lately."""
    return [endpoint for endpoint in endpoints if not endpoint.metrics.failing]


def fresh_unsaturated(
    endpoints: Sequence[Endpoint],
    now: float,
    staleness: float,
    queue_depth_threshold: float,
    kv_cache_threshold: float,
) -> tuple[list[Endpoint], float]:
    """The endpoints with fresh metrics below both saturation thresholds
    (waiting queue, KV-cache usage), and until when that answer holds for
    these endpoints (the moment the first of them turns stale)."""
    kept = []
    valid_until = float("inf")
    oldest_fresh = now - staleness
    for endpoint in endpoints:
        metrics = endpoint.metrics
        updated_at = metrics.updated_at
        if (
            updated_at is None
            or updated_at < oldest_fresh
            or metrics.failing
            or metrics.waiting >= queue_depth_threshold
            or metrics.kv_usage >= kv_cache_threshold
        ):
            continue
        kept.append(endpoint)
        if updated_at + staleness < valid_until:
            valid_until = updated_at + staleness
    return kept, valid_until
