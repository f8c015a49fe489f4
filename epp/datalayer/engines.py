"""Which Prometheus series carry an engine's load, per model-server engine.

The endpoint's label `inference.networking.k8s.io/engine-type` picks the
mapping (default `vllm`), as in the reference EPP.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineMetricNames:
    """Series names for one engine. `lora_info` is vLLM's LoRA gauge (labels
    running_lora_adapters, waiting_lora_adapters, max_lora; the sample with
    the largest value, a timestamp, is the newest). `cache_info` is a gauge
    whose labels carry the KV block size and block count; `block_size_gauge`
    a gauge whose value is the block size."""

    waiting: str
    running: str
    kv_usage: str
    lora_info: str | None = None
    cache_info: str | None = None
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    block_size_gauge: str | None = None

    def names(self) -> tuple[str, ...]:
        """Every series name this mapping reads."""
        optional = (self.lora_info, self.cache_info, self.block_size_gauge)
        return (
            self.waiting,
            self.running,
            self.kv_usage,
            *(name for name in optional if name is not None),
        )


ENGINES: dict[str, EngineMetricNames] = {
    "vllm": EngineMetricNames(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage="vllm:kv_cache_usage_perc",
        lora_info="vllm:lora_requests_info",
        cache_info="vllm:cache_config_info",
    ),
    "sglang": EngineMetricNames(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage="sglang:token_usage",
        cache_info="sglang:cache_config_info",
        block_size_label="page_size",
        num_blocks_label="num_pages",
    ),
    "trtllm-serve": EngineMetricNames(
        waiting="trtllm_num_requests_waiting",
        running="trtllm_num_requests_running",
        kv_usage="trtllm_kv_cache_utilization",
        block_size_gauge="trtllm_kv_cache_tokens_per_block",
    ),
}


def engine_metric_names(engine: str) -> EngineMetricNames:
    """The mapping for `engine`; a clear error for an unknown one."""
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValueError(
            f"unknown model-server engine {engine!r}; known: {', '.join(ENGINES)}"
        ) from None
