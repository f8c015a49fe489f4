"""The words the metric declarations are written in: the bucket lists,
the label sets, the name prefixes of the metrics and of their deprecated
twins (the reference's older names), and the kinds' one-letter names.
"""

from __future__ import annotations

from epp.serve.metrics.spec import Kind

DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
    15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
SIZE_BUCKETS = tuple(2**power for power in range(6, 31))
INPUT_TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
RESPONSE_SIZE_BUCKETS = INPUT_TOKEN_BUCKETS[: INPUT_TOKEN_BUCKETS.index(65536) + 1]
TTFT_BUCKETS = DURATION_BUCKETS[: DURATION_BUCKETS.index(120) + 1]
NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
TPOT_BUCKETS = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.6, 0.8, 1, 2,
)  # fmt: skip
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
PROCESSING_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
)  # fmt: skip
RESPONSE_PROCESSING_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
CYCLE_BUCKETS = SCHEDULER_BUCKETS
"""The reference's buckets for the enqueue and dispatch-cycle durations (the same list)."""
LOOKUP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Prometheus's default buckets, which the reference's lookup latency uses."""
HIT_RATIO_BUCKETS = tuple(step / 10 for step in range(11))
HIT_BYTES_BUCKETS = (0, *(2**power for power in range(4, 17)))
QUEUE_BUCKETS = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip

MODEL = ("model_name", "target_model_name")
REQUEST = (*MODEL, "fairness_id", "priority")
"""The canonical labels of the request and latency metrics."""
QUEUE = ("fairness_id", "priority", "inference_pool", *MODEL)
POOL_STAGE = ("inference_pool", "stage")
PER_ENDPOINT = ("name", "model_server_endpoint")
LIMIT = ("inference_pool", "endpoint")
SESSIONS = ("inference_pool", "plugin")
PLUGIN = ("plugin_name", "plugin_type")
POD = ("pod_identifier",)

C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
P = "llm_d_epp_"
OBJECTIVE = "inference_objective_"
EXTENSION = "inference_extension_"
POOL = "inference_pool_"
SCHEDULER = "llm_d_inference_scheduler_"
KVCACHE_INDEX = "kvcache_index_"
"""The prefix of the KV-cache index counters' deprecated twins
(`pkg/kvcache/metrics/collector.go`)."""
