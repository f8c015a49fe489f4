"""What the scheduler knows about the pool: immutable endpoint snapshots.

The data layer's `EndpointStore` (live: scraped over HTTP; simulator: fed
directly) owns the endpoints and hands out a `PoolSnapshot`; the scheduler and the utilization
gate only read it. Staleness is not stored: it depends on when you ask, so it
is computed against a `now` the caller passes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from epp.api.address import address_ip


class EndpointMetrics(NamedTuple):
    """The latest model-server metrics of one endpoint.

    `kv_usage` is a fraction in [0, 1] and the counts are not negative (the
    metrics reader checks what it reads). `lora_max` of 0 means the server
    reported no LoRA information. `updated_at` is when these values were
    read (None: never); `failing` is set when the latest read failed, which
    makes the endpoint stale at once while its last values stay visible.
    `itl_sum` and `itl_count` are the server's inter-token latency histogram
    as it reports it, cumulative since it started (seconds, observations;
    both 0 when it reports none): the change between two reads is the mean
    inter-token latency over that interval. `itl_bounds` are its buckets'
    upper bounds, growing, without `+Inf` (whose count is `itl_count`), and
    `itl_buckets` their cumulative counts; both empty when it reports none: the change between
    two reads gives that interval's distribution, so a few long steps (that
    prefilled long prompts) do not hide how fast it decodes.

    A named tuple rather than a frozen dataclass: one is built per endpoint
    per scrape, and a tuple is built in C, where a frozen dataclass sets each
    field by a call to `object.__setattr__`.
    """

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    lora_max: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    updated_at: float | None = None
    failing: bool = False
    itl_sum: float = 0.0
    itl_count: float = 0.0
    itl_bounds: tuple[float, ...] = ()
    itl_buckets: tuple[float, ...] = ()

    def is_stale(self, now: float, staleness: float) -> bool:
        """Whether these values are missing, failed, or older than `staleness` at `now`."""
        return self.failing or self.updated_at is None or self.updated_at < now - staleness

    def same_values(self, other: EndpointMetrics) -> bool:
        """Equal apart from `updated_at` and the latency counters (a fresh
        read of a server whose load has not changed: the counters move with
        every step, and only the adaptive gate reads them, at its next look)."""
        return (
            self.waiting == other.waiting
            and self.running == other.running
            and self.kv_usage == other.kv_usage
            and self.lora_running == other.lora_running
            and self.lora_waiting == other.lora_waiting
            and self.lora_max == other.lora_max
            and self.block_size == other.block_size
            and self.num_gpu_blocks == other.num_gpu_blocks
            and self.failing == other.failing
        )

    def same_but_time(self, other: EndpointMetrics) -> bool:
        """Equal in every field but `updated_at` (a read of a server that
        neither moved nor stepped since `other`)."""
        return (
            self[:_UPDATED_AT] == other[:_UPDATED_AT]
            and self[_UPDATED_AT + 1 :] == other[_UPDATED_AT + 1 :]
        )


_UPDATED_AT = EndpointMetrics._fields.index("updated_at")
NO_METRICS = EndpointMetrics()


@dataclass(slots=True, eq=False)
class Endpoint:
    """One model-server endpoint (one target port of one pod), as observed
    for one snapshot. Endpoints compare by identity: the data layer makes a
    new one whenever anything about it changes, so scorers can key what they
    learn since an observation on the object itself. So an endpoint is never
    modified once built. (Not enforced with `frozen`: a snapshot rebuilds
    every endpoint at every scrape, and a frozen dataclass sets each field
    through a call to `object.__setattr__`.)

    `id` is the endpoint's identity in the reference EPP, `namespace/name`
    (a pod's endpoints are `<pod>-rank-<i>`, one per target port); session
    tokens carry it, so a token the reference issued routes here the same.
    Without one it is the endpoint's name."""

    name: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics: EndpointMetrics = NO_METRICS
    id: str = ""
    ip: str = field(init=False)

    def __post_init__(self) -> None:
        self.ip = address_ip(self.address)
        if not self.id:
            self.id = self.name

    def with_metrics(self, metrics: EndpointMetrics) -> Endpoint:
        """This endpoint observed anew with `metrics`: a new object, the rest
        copied. (Field by field rather than `dataclasses.replace`, which
        would parse the address again: the store does this per endpoint per
        scrape, `bench.simulator`.)"""
        copy = _new_endpoint(Endpoint)
        copy.name = self.name
        copy.address = self.address
        copy.labels = self.labels
        copy.metrics = metrics
        copy.id = self.id
        copy.ip = self.ip
        return copy


_new_endpoint = object.__new__


@dataclass(slots=True, frozen=True)
class PoolSnapshot:
    """The pool at one moment. `version` grows with every change (metrics
    included), `membership` only when endpoints join or leave, so readers can
    cache what they derive from a snapshot until the matching number moves."""

    endpoints: tuple[Endpoint, ...] = ()
    version: int = 0
    membership: int = 0


EMPTY_POOL = PoolSnapshot()
