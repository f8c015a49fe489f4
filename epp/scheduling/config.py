"""Configuration of the scheduler: profiles (filters, weighted scorers, a
picker), the profile handler, the prefix index and the saturation filter.

Plugins are `PluginSpec`s (see `spec`): the configuration file's loader
makes them from the registry; the defaults below are the reference EPP's
default profile (queue 2, KV cache 2, prefix 3, max-score picker).
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.scheduling.cache_scorers import prefix_cache_scorer
from epp.scheduling.kvblocks import PreciseConfig
from epp.scheduling.pickers import max_score_picker
from epp.scheduling.profiles import single_profile_handler
from epp.scheduling.saturation import DEFAULT_THRESHOLDS, SaturationThresholds
from epp.scheduling.scorers import kv_cache_scorer, queue_scorer
from epp.scheduling.spec import PluginSpec, spec


@dataclass(slots=True, frozen=True)
class ScorerConfig:
    """A scorer with its weight (unset weights are 1.0)."""

    plugin: PluginSpec
    weight: float = 1.0

    @property
    def name(self) -> str:
        return self.plugin.name


DEFAULT_SCORERS = (
    ScorerConfig(PluginSpec("queue-scorer", queue_scorer), 2.0),
    ScorerConfig(PluginSpec("kv-cache-utilization-scorer", kv_cache_scorer), 2.0),
    ScorerConfig(
        spec(
            "prefix-cache-scorer",
            prefix_cache_scorer,
            match_length_weight=0.0,
            match_length_scale_tokens=8192,
        ),
        3.0,
    ),
)
MAX_SCORE_PICKER = PluginSpec("max-score-picker", max_score_picker)
SINGLE_PROFILE_HANDLER = PluginSpec("single-profile-handler", single_profile_handler)


@dataclass(slots=True, frozen=True)
class ProfileConfig:
    """One scheduling profile: filters in order, then the weighted sum of
    the scorers, then the picker."""

    name: str = "default"
    filters: tuple[PluginSpec, ...] = ()
    scorers: tuple[ScorerConfig, ...] = DEFAULT_SCORERS
    picker: PluginSpec = MAX_SCORE_PICKER


@dataclass(slots=True, frozen=True)
class SchedulingConfig:
    """Profiles and the handler that runs them. Prefix-cache blocks are
    `prefix_block_chars` characters (16 tokens x 4 characters), at most
    `prefix_max_blocks` per prompt, at most `prefix_lru_capacity` hashes per
    endpoint (in two generations, see `prefix`).

    Before the profiles run, endpoints that `saturation` calls saturated
    (stale metrics, a full waiting queue or KV cache) are dropped, unless that
    would drop them all. The same thresholds are the utilization gate's and
    the pool-saturation gauge's (`epp.scheduling.saturation`)."""

    profiles: tuple[ProfileConfig, ...] = (ProfileConfig(),)
    handler: PluginSpec = SINGLE_PROFILE_HANDLER
    producers: tuple[PluginSpec, ...] = ()
    """Data producers run on each request before the profiles (`produce`)."""
    prefix_block_chars: int = 64
    prefix_max_blocks: int = 256
    prefix_lru_capacity: int = 31_250
    prefix_producer: str = "approx-prefix-cache-producer"
    """The approx-prefix-cache-producer's configured name (its metrics' `plugin_name`)."""
    prefix_auto_tune: bool = False
    """Block size and per-endpoint capacity from the endpoints' metrics
    (the producer's `autoTune`; see `cache_scorers.PrefixCacheScorer`)."""
    prefix_max_tokens: int = 0
    """`maxPrefixTokensToMatch`: with an auto-tuned block size, the blocks
    per prompt are these tokens over the block size (0: `prefix_max_blocks`)."""
    saturation: SaturationThresholds = DEFAULT_THRESHOLDS
    precise: PreciseConfig | None = None
    """The precise-prefix-cache-producer, when configured (`kvblocks`)."""
