"""The metrics pages of a simulated model server, posing as vLLM, SGLang or trtllm-serve.

Each pose writes the series, labels and path of the engine it poses as (the
engine table in `epp.datalayer.engines` says where each engine defines them):

- `vllm`: `/metrics`; labels model_name and engine; running, waiting,
  `vllm:kv_cache_usage_perc`, `vllm:cache_config_info` with CacheConfig's
  fields as labels, `vllm:lora_requests_info` when adapters are configured,
  the TTFT and e2e histograms, `vllm:request_success_total` by finish reason
  (`abort` for a request whose client went away), prompt/generation tokens,
  `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (the
  finished requests' prompt and cached tokens), and
  `vllm:inter_token_latency_seconds`.
- `sglang`: `/metrics`; the scheduler's gauges (running, queue, token
  usage, page size and count) with labels model_name, engine_type, tp_rank,
  pp_rank, moe_ep_rank, declared but without a sample until the first
  request (as SGLang creates them when stats are first logged); the
  tokenizer's TTFT, e2e and `sglang:inter_token_latency_seconds` histograms
  and request and token counters.
- `trtllm-serve`: the Prometheus text at `/prometheus/metrics` (gauges with
  the multiprocess collector's `pid` label, appearing only after the first
  iteration's stats), and `/metrics` as its JSON list of iteration stats.

The live gauges are read from the model at scrape time; histograms and
counters are prometheus-client objects in one registry per server, except
the inter-token latency histogram, which the model keeps itself (sum, count
and vLLM's buckets, per run of decode steps, not per token) and each scrape
shows as it is (trtllm-serve has no such histogram).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from epp.scheduling.endpoint import EndpointMetrics
from epp.sim.server_model import ServerParams

ENGINES = ("vllm", "sglang", "trtllm-serve")
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

State = Callable[[], EndpointMetrics]
"""The model's state now."""


class MetricsPages:
    """One server's metrics in the pose of `engine`; see the module docstring."""

    def __init__(
        self,
        engine: str,
        model_name: str,
        params: ServerParams,
        state: State,
        started: Callable[[], bool],
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=False)
        self._pid = str(os.getpid())
        self._iteration = 0
        self._state = state
        self._started = started
        prefix = {"vllm": "vllm:", "sglang": "sglang:", "trtllm-serve": "trtllm_"}[engine]
        if engine == "vllm":
            labels = {"model_name": model_name, "engine": "0"}
            gauges: Collector = _VllmGauges(state, labels, params)
        elif engine == "sglang":
            labels = {"model_name": model_name}
            scheduler_labels = {
                "engine_type": "unified",
                "model_name": model_name,
                "moe_ep_rank": "0",
                "pp_rank": "0",
                "tp_rank": "0",
            }
            gauges = _SglangGauges(state, scheduler_labels, started)
        else:
            labels = {"engine_type": "undefined", "model_name": "undefined"}
            gauges = _TrtllmGauges(state, labels | {"pid": self._pid}, started)
        self.registry.register(gauges)
        if engine != "trtllm-serve":
            self.registry.register(
                _InterTokenLatency(f"{prefix}inter_token_latency_seconds", state, labels)
            )
        names = list(labels)
        self._labels = list(labels.values())

        def series(kind: type[Counter | Histogram], name: str, about: str, **options: Any) -> Any:
            """One of this server's series: in its registry, with its labels' values."""
            made = kind(name, about, names, registry=self.registry, **options)
            return made.labels(*self._labels)

        self._ttft = series(
            Histogram,
            f"{prefix}time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
        )
        self._e2e = series(
            Histogram,
            f"{prefix}e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            buckets=LATENCY_BUCKETS,
        )
        # SGLang's tokenizer counts requests without a finish reason.
        self._by_reason = engine != "sglang"
        self._success = Counter(
            f"{prefix}request_success" if self._by_reason else "sglang:num_requests",
            "Count of successfully processed requests."
            if self._by_reason
            else "Number of requests processed.",
            [*names, "finished_reason"] if self._by_reason else names,
            registry=self.registry,
        )
        self._prompt_tokens = series(
            Counter, f"{prefix}prompt_tokens", "Number of prefill tokens processed."
        )
        self._generation_tokens = series(
            Counter, f"{prefix}generation_tokens", "Number of generation tokens processed."
        )

        self._prefix_cache: tuple[Any, Any] | None = None
        if engine == "vllm":
            self._prefix_cache = (
                series(
                    Counter,
                    "vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                ),
                series(
                    Counter,
                    "vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                ),
            )

        self._remote_prefills = series(
            Counter, "epp_sim_remote_prefills", "Prefills run for a remote decode."
        )

    def remote_prefill(self) -> None:
        self._remote_prefills.inc()

    @property
    def prometheus_path(self) -> str:
        return "/prometheus/metrics" if self.engine == "trtllm-serve" else "/metrics"

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def finished(
        self, seconds: float, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0
    ) -> None:
        self._e2e.observe(seconds)
        if self._prefix_cache is not None:
            queries, hits = self._prefix_cache
            queries.inc(prompt_tokens)
            hits.inc(cached_tokens)
        reason = ("length",) if self._by_reason else ()
        self._success.labels(*self._labels, *reason).inc()
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(output_tokens)

    def aborted(self) -> None:
        if self._by_reason:
            self._success.labels(*self._labels, "abort").inc()

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)

    def iteration_stats(self) -> list[dict[str, Any]]:
        """trtllm-serve's JSON `/metrics`: the latest iteration's stats."""
        state = self._state()
        self._iteration += 1
        blocks = state.num_gpu_blocks or 0
        used = round(state.kv_usage * blocks)
        return [
            {
                "iter": self._iteration,
                "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
                "numActiveRequests": int(state.running),
                "numQueuedRequests": int(state.waiting),
                "kvCacheStats": {
                    "maxNumBlocks": blocks,
                    "usedNumBlocks": used,
                    "freeNumBlocks": blocks - used,
                    "tokensPerBlock": state.block_size,
                },
            }
        ]


def _gauge(name: str, text: str, labels: dict[str, str], value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=list(labels))
    if value is not None:
        family.add_metric(list(labels.values()), value)
    return family


class _VllmGauges(Collector):
    """vllm/v1/metrics/loggers.py's scheduler gauges and info gauges."""

    def __init__(self, state: State, labels: dict[str, str], params: ServerParams) -> None:
        self._state = state
        self._labels = labels
        self._params = params

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        labels = self._labels
        yield _gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            state.running,
        )
        yield _gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            state.waiting,
        )
        yield _gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels,
            state.kv_usage,
        )
        params = self._params
        cache_config = {
            "block_size": str(params.block_size),
            "cache_dtype": "auto",
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": "True",
            "engine": labels["engine"],
            "gpu_memory_utilization": "0.9",
            "is_attention_free": "False",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(params.kv_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            "swap_space": "4",
        }
        yield _gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", cache_config, 1.0
        )
        if params.max_loras:
            lora = {
                "max_lora": str(state.lora_max),
                "waiting_lora_adapters": ",".join(sorted(state.lora_waiting)),
                "running_lora_adapters": ",".join(sorted(state.lora_running)),
            }
            yield _gauge(
                "vllm:lora_requests_info", "Running stats on lora requests.", lora, time.time()
            )


class _SglangGauges(Collector):
    """python/sglang/srt/metrics/collector.py's SchedulerMetricsCollector gauges:
    declared from the start, with a sample once stats were first logged."""

    def __init__(self, state: State, labels: dict[str, str], started: Callable[[], bool]) -> None:
        self._state = state
        self._labels = labels
        self._started = started

    def collect(self) -> Iterator[Metric]:
        state = self._state() if self._started() else None
        labels = self._labels
        for name, text, value in (
            ("sglang:num_running_reqs", "The number of running requests.", "running"),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "waiting"),
            ("sglang:token_usage", "The token usage.", "kv_usage"),
            ("sglang:page_size", "KV cache page size in tokens.", "block_size"),
            ("sglang:num_pages", "Number of KV cache pages.", "num_gpu_blocks"),
        ):
            yield _gauge(name, text, labels, getattr(state, value) if state else None)


class _TrtllmGauges(Collector):
    """tensorrt_llm/metrics/collector.py's iteration gauges as its
    multiprocess registry shows them: with pid, and only once logged."""

    def __init__(self, state: State, labels: dict[str, str], started: Callable[[], bool]) -> None:
        self._state = state
        self._labels = labels
        self._started = started

    def collect(self) -> Iterator[Metric]:
        cached = CounterMetricFamily(
            "trtllm_prompt_cached_tokens",
            "Process-lifetime total prompt tokens served from KV cache.",
            labels=["engine_type", "model_name"],
        )
        cached.add_metric(["undefined", "undefined"], 0.0)
        yield cached
        if not self._started():
            return
        state = self._state()
        blocks = state.num_gpu_blocks or 0
        labels = self._labels
        for name, text, value in (
            ("trtllm_num_requests_running", "Number of active requests", state.running),
            ("trtllm_num_requests_waiting", "Number of queued requests", state.waiting),
            ("trtllm_kv_cache_utilization", "KV cache utilization", state.kv_usage),
            ("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", blocks),
            ("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks",
             round(state.kv_usage * blocks)),
            ("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block",
             state.block_size),
        ):  # fmt: skip
            yield _gauge(name, text, labels, value)


class _InterTokenLatency(Collector):
    """The model's inter-token latency as a histogram (see the module docstring)."""

    def __init__(self, name: str, state: State, labels: dict[str, str]) -> None:
        self._name = name
        self._state = state
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        family = HistogramMetricFamily(
            self._name, "Histogram of inter-token latency in seconds.", labels=list(self._labels)
        )
        buckets = [
            (str(bound), count)
            for bound, count in zip(state.itl_bounds, state.itl_buckets, strict=True)
        ]
        buckets.append(("+Inf", state.itl_count))
        family.add_metric(list(self._labels.values()), buckets, sum_value=state.itl_sum)
        yield family
