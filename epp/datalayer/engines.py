"""Which Prometheus series carry a model server's load, per engine: the one table.

Each engine's entry names the series the reader takes waiting, running,
KV-cache use, LoRA adapters, the KV block geometry and the inter-token
latency histogram (the adaptive gate's latency signal) from, each with the
place in the engine's own source that defines it, plus where the page is
served (`metrics_path`) and which labels tell separate schedulers apart
(`rank_labels`: their samples are summed; samples that differ only in other
labels are copies of one scheduler's state and are counted once).

Which engine an endpoint runs comes from its pod label `llm-d.ai/engine-type`
(the legacy `inference.networking.k8s.io/engine-type` is still read), else
the configured default (`vllm`), as in the reference's core-metrics-extractor.
An unknown engine name falls back to the default engine's table, also as the
reference does, with a warning once per name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

ENGINE_LABEL = "llm-d.ai/engine-type"
LEGACY_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
DEFAULT_ENGINE = "vllm"


@dataclass(slots=True, frozen=True)
class Series:
    """One series selector: a metric name and the label values its samples
    must carry (the reference's `name{label=value}` spec)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.labels)


_SPEC = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{([^}]*)\})?\s*$")
_PAIR = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"?([^",]*)"?\s*$')


def parse_series(spec: str) -> Series:
    """`name` or `name{label=value,...}` (values quoted or not); ValueError otherwise."""
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f"not a metric specification: {spec!r}")
    pairs: list[tuple[str, str]] = []
    if match.group(2) and match.group(2).strip():
        for pair in match.group(2).split(","):
            found = _PAIR.match(pair)
            if found is None:
                raise ValueError(f"bad label pair {pair!r} in metric specification {spec!r}")
            pairs.append((found.group(1), found.group(2)))
    return Series(match.group(1), tuple(pairs))


@dataclass(slots=True, frozen=True)
class EngineMetricNames:
    """Where one engine puts its load. For waiting, running and KV use the
    first series of the tuple that the page carries is read (newest name
    first). `prefix` is what every series of the engine starts with: a page
    without any is not this engine's (a wrong label or path), while a page of
    the engine that lacks a load series is a server with no load yet."""

    waiting: tuple[Series, ...]
    running: tuple[Series, ...]
    kv_usage: tuple[Series, ...]
    prefix: str | None = None
    rank_labels: frozenset[str] = frozenset()
    lora_info: str | None = None
    """Labels running_lora_adapters, waiting_lora_adapters, max_lora; the
    sample with the largest value (a timestamp) is the newest."""
    cache_info: str | None = None
    """An info gauge whose labels carry the block size and count."""
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    block_size_gauge: Series | None = None
    num_blocks_gauge: Series | None = None
    metrics_path: str = "/metrics"
    itl: tuple[str, ...] = ()
    """Histograms of the server's inter-token latency, newest name first:
    the first the page carries is read (its `_sum`, `_count` and
    `_bucket`s, summed over label sets). None: the gate measures latency on responses."""

    def names(self) -> tuple[str, ...]:
        """Every series name this mapping reads, once each."""
        found: dict[str, None] = {}
        for series in (*self.waiting, *self.running, *self.kv_usage):
            found[series.name] = None
        for name in (self.lora_info, self.cache_info):
            if name is not None:
                found[name] = None
        for gauge in (self.block_size_gauge, self.num_blocks_gauge):
            if gauge is not None:
                found[gauge.name] = None
        return tuple(found)


def _s(name: str, **labels: str) -> Series:
    return Series(name, tuple(labels.items()))


ENGINES: dict[str, EngineMetricNames] = {
    "vllm": EngineMetricNames(
        # vllm/v1/metrics/loggers.py, PrometheusStatLogger: labels model_name
        # and engine (the engine core's index: one per data-parallel rank).
        # With several API servers the page is assembled by prometheus_client's
        # multiprocess collector, which adds `pid` to gauges not in
        # "mostrecent" mode (kv_cache_usage_perc): copies, not ranks.
        waiting=(_s("vllm:num_requests_waiting"),),  # gauge_scheduler_waiting
        running=(_s("vllm:num_requests_running"),),  # gauge_scheduler_running
        kv_usage=(
            _s("vllm:kv_cache_usage_perc"),  # gauge_kv_cache_usage, since 0.9
            # gauge_gpu_cache_usage: the V0 engine (vllm/engine/metrics.py,
            # labels model_name only) and v1 before 0.9; deprecated in 0.9.2,
            # hidden from 0.11 unless --show-hidden-metrics-for-version.
            _s("vllm:gpu_cache_usage_perc"),
        ),
        prefix="vllm:",
        rank_labels=frozenset({"engine"}),
        itl=(
            # histogram_inter_token_latency, since 0.11 (one observation per
            # request per engine step that gave it tokens);
            "vllm:inter_token_latency_seconds",
            # histogram_time_per_output_token, the same values under the name
            # 0.11 deprecated (hidden in 0.12, removed in 0.13).
            "vllm:time_per_output_token_seconds",
        ),
        lora_info="vllm:lora_requests_info",  # gauge_lora_info, with --enable-lora
        # log_metrics_info("cache_config", ...): every CacheConfig field as a
        # label, str()'d, so an unset num_gpu_blocks reads "None".
        cache_info="vllm:cache_config_info",
    ),
    "sglang": EngineMetricNames(
        # python/sglang/srt/metrics/collector.py, SchedulerMetricsCollector;
        # labels from scheduler_metrics_mixin.init_metrics: model_name,
        # engine_type, tp_rank, pp_rank (and moe_ep_rank in newer releases),
        # dp_rank with data-parallel attention. Only TP rank 0 reports unless
        # --enable-metrics-for-all-schedulers, which repeats the same state
        # once per TP/PP/EP rank; data-parallel ranks are separate schedulers.
        waiting=(_s("sglang:num_queue_reqs"),),  # num_queue_reqs
        running=(_s("sglang:num_running_reqs"),),  # num_running_reqs
        kv_usage=(_s("sglang:token_usage"),),  # token_usage, 0-1
        prefix="sglang:",
        rank_labels=frozenset({"dp_rank"}),
        # TokenizerMetricsCollector.histogram_inter_token_latency (labels
        # model_name and the tokenizer's own), observed per output chunk: its
        # `_sum` grows by the chunk's interval, its buckets (so `_count`) by
        # the chunk's tokens.
        itl=("sglang:inter_token_latency_seconds",),
        # Releases before 0.5.11 carry the page geometry as labels of an info
        # gauge (the reference's table); later ones as the gauges page_size
        # and num_pages of SchedulerMetricsCollector.
        cache_info="sglang:cache_config_info",
        block_size_label="page_size",
        num_blocks_label="num_pages",
        block_size_gauge=_s("sglang:page_size"),
        num_blocks_gauge=_s("sglang:num_pages"),
    ),
    "trtllm-serve": EngineMetricNames(
        # tensorrt_llm/metrics/collector.py, MetricsCollector.log_iteration_stats
        # (labels model_name, engine_type). trtllm-serve's GET /metrics is a
        # JSON list of iteration stats; the Prometheus text is mounted at
        # /prometheus/metrics (serve/openai_server.py, mount_metrics), only
        # with return_perf_metrics: true. Its gauges have labels, so they
        # appear only once the first iteration's stats are logged.
        waiting=(_s("trtllm_num_requests_waiting"),),  # numQueuedRequests
        running=(_s("trtllm_num_requests_running"),),  # numActiveRequests
        kv_usage=(_s("trtllm_kv_cache_utilization"),),  # usedNumBlocks / maxNumBlocks
        prefix="trtllm_",
        block_size_gauge=_s("trtllm_kv_cache_tokens_per_block"),  # tokensPerBlock
        num_blocks_gauge=_s("trtllm_kv_cache_max_blocks"),  # maxNumBlocks
        metrics_path="/prometheus/metrics",
        # No inter-token histogram: trtllm_time_per_output_token_seconds is
        # observed once per request, at its end, as the EPP's own measure is.
    ),
    "triton-tensorrt-llm": EngineMetricNames(
        # Triton's TensorRT-LLM backend, as the reference's built-in table
        # (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go)
        # names it; no Triton source was checked.
        waiting=(_s("nv_trt_llm_request_metrics", request_type="waiting"),),
        running=(_s("nv_trt_llm_request_metrics", request_type="scheduled"),),
        kv_usage=(_s("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction"),),
        prefix="nv_trt_llm_",
        block_size_gauge=_s("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per"),
        num_blocks_gauge=_s("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max"),
    ),
}


ENGINE_CONFIG_FIELDS = frozenset(
    {
        "name",
        "queuedRequestsSpec",
        "runningRequestsSpec",
        "kvUsageSpec",
        "loraSpec",
        "cacheInfoSpec",
        "cacheBlockSizeLabelName",
        "cacheNumBlocksLabelName",
        "cacheBlockSizeSpec",
        "cacheNumBlocksSpec",
        "customMetrics",
    }
)
"""The fields of one of the reference's `engineConfigs` entries."""


def engine_from_config(config: Mapping[str, Any]) -> EngineMetricNames:
    """An engine table from one `engineConfigs` entry of core-metrics-extractor
    (metric specs as `name{label=value}`; an empty spec reads nothing).
    ValueError names the field at fault."""
    unknown = sorted(set(config) - ENGINE_CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field")

    def spec(field: str) -> Series | None:
        value = config.get(field) or ""
        if not isinstance(value, str):
            raise ValueError(f"{field}: must be a metric spec, got {value!r}")
        try:
            return parse_series(value) if value else None
        except ValueError as error:
            raise ValueError(f"{field}: {error}") from None

    def one(field: str) -> tuple[Series, ...]:
        found = spec(field)
        return (found,) if found is not None else ()

    lora, cache = spec("loraSpec"), spec("cacheInfoSpec")
    return EngineMetricNames(
        waiting=one("queuedRequestsSpec"),
        running=one("runningRequestsSpec"),
        kv_usage=one("kvUsageSpec"),
        lora_info=lora.name if lora else None,
        cache_info=cache.name if cache else None,
        block_size_label=config.get("cacheBlockSizeLabelName") or "block_size",
        num_blocks_label=config.get("cacheNumBlocksLabelName") or "num_gpu_blocks",
        block_size_gauge=spec("cacheBlockSizeSpec"),
        num_blocks_gauge=spec("cacheNumBlocksSpec"),
    )


@dataclass(slots=True)
class EngineLookup:
    """An endpoint's engine table from its labels (see the module docstring).
    `engines` holds the built-in tables plus any configured ones (one of the
    same name replaces the built-in)."""

    default_engine: str = DEFAULT_ENGINE
    label_key: str = ENGINE_LABEL
    engines: Mapping[str, EngineMetricNames] = field(default_factory=lambda: ENGINES)
    _warned: set[str] = field(default_factory=set, repr=False)

    @classmethod
    def from_configs(
        cls, default_engine: str, label_key: str, configs: Iterable[Mapping[str, Any]]
    ) -> EngineLookup:
        """The built-in engines plus `engineConfigs` entries."""
        engines = dict(ENGINES)
        for config in configs:
            name = config.get("name")
            try:
                engines[str(name)] = engine_from_config(config)
            except ValueError as error:
                raise ValueError(f"engine {name!r}: {error}") from None
        return cls(default_engine, label_key, engines)

    def __post_init__(self) -> None:
        if self.default_engine not in self.engines:
            raise ValueError(
                f"default engine {self.default_engine!r} is not one of: {', '.join(self.engines)}"
            )

    def engine_name(self, labels: Mapping[str, str]) -> str:
        """The engine the labels name (default when unlabelled or unknown)."""
        name = labels.get(self.label_key) or labels.get(LEGACY_ENGINE_LABEL)
        if not name:
            return self.default_engine
        if name not in self.engines:
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "unknown model-server engine %r; reading its metrics as %r (known: %s)",
                    name,
                    self.default_engine,
                    ", ".join(self.engines),
                )
            return self.default_engine
        return name

    def names_for(self, labels: Mapping[str, str]) -> EngineMetricNames:
        return self.engines[self.engine_name(labels)]
