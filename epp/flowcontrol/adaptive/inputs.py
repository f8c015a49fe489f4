"""What the adaptive gate reads (a pool snapshot and each endpoint's
latest scrape) and its settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Sample(Protocol):
    """One scrape of a model server (`EndpointMetrics` is one);
    `updated_at` is when the server was read (the scrape asked for it):
    what the EPP sent after that may be missing from it."""

    @property
    def waiting(self) -> float: ...
    @property
    def running(self) -> float: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def updated_at(self) -> float | None: ...
    @property
    def failing(self) -> bool: ...
    @property
    def itl_sum(self) -> float: ...
    @property
    def itl_count(self) -> float: ...
    @property
    def itl_bounds(self) -> tuple[float, ...]: ...
    @property
    def itl_buckets(self) -> tuple[float, ...]: ...


class Observed(Protocol):
    """An endpoint and its latest sample (`Endpoint` is one)."""

    @property
    def address(self) -> str: ...
    @property
    def metrics(self) -> Sample: ...


class Observations(Protocol):
    """A pool snapshot (`PoolSnapshot` is one): `version` moves on every change."""

    @property
    def endpoints(self) -> Sequence[Observed]: ...
    @property
    def version(self) -> int: ...


@dataclass(slots=True, frozen=True)
class AdaptiveLimits:
    """The estimator's settings. None of them is a per-deployment number:
    they bound the search and set its pace, not its result.

    `initial`: the limit of a new endpoint (safe: below any real batch).
    `maximum`: no endpoint's limit grows past it (a resource bound).
    `pending`: requests an endpoint may hold that it was not yet seen
    running (its queue, plus what was sent since its last sample).
    `full_after`: at a server without the latency histogram (whose step
    ends are not seen), how long (s) a probe may find no room before the
    limit is held (a server that takes the probe is between two steps at
    most this long).
    `probe_interval`: once the size is known, how often (s) the limit tries
    one more while the limit holds requests back.
    `window`: how long (s) a server must keep a queue (half its samples)
    while running less than 90% of its limit for the limit to drop to the
    most it ran.
    `blind_after`: an endpoint with no sample newer than this (s), or none
    yet, is not learned from: the gate's fixed limit applies, no budget.
    `slower`: an endpoint whose inter-token latency, over the median of
    the others', grew this many times over what it was when it ran full has
    slowed down: its limit is divided by that factor. It may grow again
    once that factor, averaged longer, is back under `recovered`.
    """

    initial: int = 4
    maximum: int = 1024
    pending: int = 1
    full_after: float = 1.0
    probe_interval: float = 5.0
    window: float = 2.0
    blind_after: float = 1.0
    slower: float = 2.0
    recovered: float = 1.25
