"""Configuration of the scheduler: which scorers, their weights, the picker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ScorerConfig:
    """A scorer by its plugin name (the reference EPP's names, e.g.
    `queue-scorer`) with its weight; unset weights are 1.0."""

    name: str
    weight: float = 1.0


DEFAULT_SCORERS = (
    ScorerConfig("queue-scorer", 2.0),
    ScorerConfig("kv-cache-utilization-scorer", 2.0),
    ScorerConfig("prefix-cache-scorer", 3.0),
)


@dataclass(slots=True, frozen=True)
class SchedulingConfig:
    """Scorers and picker (`max-score-picker`, `weighted-random-picker`,
    `random-picker`). Prefix-cache blocks are `prefix_block_chars` characters
    (16 tokens x 4 characters, as the reference EPP), at most
    `prefix_max_blocks` per prompt, at most `prefix_lru_capacity` hashes per
    endpoint (in two generations, see `prefix`).

    Before scoring, endpoints whose metrics are older than `metrics_staleness`
    seconds, or whose waiting queue reaches `saturation_queue_depth` or KV-cache
    usage `saturation_kv_cache`, are dropped, unless that would drop them all."""

    scorers: tuple[ScorerConfig, ...] = DEFAULT_SCORERS
    picker: str = "max-score-picker"
    prefix_block_chars: int = 64
    prefix_max_blocks: int = 256
    prefix_lru_capacity: int = 31_250
    metrics_staleness: float = 0.2
    saturation_queue_depth: float = 5.0
    saturation_kv_cache: float = 0.8
