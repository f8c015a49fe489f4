"""Every metric epp writes, once: its exposed name, kind, labels, help,
buckets and deprecated twin (by name). The recorder, the scrape-time
collectors and the docs' metric table all read this list; a metric not
here cannot be written.

Names are the exposed names (a counter's ends in `_total`). A twin is the
name the reference's older dashboards read (`inference_objective_*`,
`inference_pool_*`, `inference_extension_*`, `llm_d_inference_scheduler_*`):
it carries the canonical labels it names, renamed where the reference's
twin used another name, and sums the canonical series that share them
(llm-d-router `docs/metrics.md`, `pkg/epp/metrics/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from epp.serve.metrics.spec import Kind, Spec, Twin

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


def _request(
    name: str, kind: Kind, text: str, twin: str | None, buckets=(), labels=REQUEST, keep=MODEL
):
    return Spec(
        P + name, kind, text, labels, buckets,
        None if twin is None else Twin(OBJECTIVE + twin, keep),
    )  # fmt: skip


def _index_counter(noun: str, text: str) -> Spec:
    name = f"{P}kv_cache_index_{noun}_total"
    twin = Twin(f"{KVCACHE_INDEX}{noun}_total", help=f"Deprecated: use {name}. {text}")
    return Spec(name, C, text + ".", twin=twin)


def _pool_average(noun: str) -> tuple[Spec, Spec]:
    words = noun.replace("_", " ")
    return (
        Spec(
            f"{P}average_{noun}", G, f"Mean {words} of the pool's endpoints.", ("name",),
            twin=Twin(f"{POOL}average_{noun}"),
        ),
        Spec(
            f"{P}std_dev_{noun}", G, f"Spread of {words} over the endpoints.", ("name",),
        ),
    )  # fmt: skip


CATALOGUE: tuple[Spec, ...] = (
    _request(
        "request_total",
        C,
        "Requests that reached flow control.",
        "request_total",
        keep=(*MODEL, "priority"),
    ),
    _request(
        "request_error_total",
        C,
        "Requests answered with an error.",
        "request_error_total",
        labels=(*REQUEST, "error_code"),
        keep=(*MODEL, "error_code"),
    ),
    _request(
        "request_duration_seconds",
        H,
        "From the end of the request body to the end of the response.",
        "request_duration_seconds",
        DURATION_BUCKETS,
    ),
    _request("request_size_bytes", H, "Request body size in bytes.", "request_sizes", SIZE_BUCKETS),
    _request(
        "request_input_tokens",
        H,
        "Prompt tokens the model server reported.",
        "input_tokens",
        INPUT_TOKEN_BUCKETS,
    ),
    _request(
        "request_output_tokens",
        H,
        "Completion tokens the model server reported.",
        "output_tokens",
        OUTPUT_TOKEN_BUCKETS,
    ),
    _request(
        "request_cached_tokens",
        H,
        "Prompt tokens read from the model server's cache, as its response reported.",
        "prompt_cached_tokens",
        INPUT_TOKEN_BUCKETS,
    ),
    _request(
        "request_ntpot_seconds",
        H,
        "Request duration divided by output tokens.",
        "normalized_time_per_output_token_seconds",
        NTPOT_BUCKETS,
    ),
    _request(
        "response_size_bytes",
        H,
        "Response body size in bytes.",
        "response_sizes",
        RESPONSE_SIZE_BUCKETS,
    ),
    _request(
        "request_ttft_seconds",
        H,
        "From the end of the request body to the first response body bytes.",
        None,
        TTFT_BUCKETS,
        labels=(*REQUEST, "streaming"),
    ),
    _request(
        "request_streaming_tpot_seconds",
        H,
        "Time per output token after the first, of streamed responses.",
        None,
        TPOT_BUCKETS,
    ),
    _request(
        "request_streaming_itl_seconds",
        H,
        "Time between consecutive response body chunks of streamed responses.",
        None,
        ITL_BUCKETS,
    ),
    _request(
        "request_running",
        G,
        "Requests dispatched and not finished.",
        "running_requests",
        keep=("model_name",),
    ),
    Spec(
        P + "request_processing_duration_seconds",
        H,
        "From the end of the request body to its flow-control outcome, queue wait included.",
        buckets=PROCESSING_BUCKETS,
    ),
    Spec(
        P + "response_processing_duration_seconds",
        H,
        "The EPP's own time on a response: the sum of its handling of each response "
        "message (the waits between them are the model server's).",
        buckets=RESPONSE_PROCESSING_BUCKETS,
    ),
    Spec(
        P + "flow_control_request_queue_duration_seconds",
        H,
        "Time a request spent in flow control, by how it left.",
        ("fairness_id", "priority", "outcome", "inference_pool", *MODEL),
        QUEUE_BUCKETS,
        Twin(EXTENSION + "flow_control_request_queue_duration_seconds"),
    ),
    Spec(
        P + "flow_control_request_enqueue_duration_seconds",
        H,
        "Time of the call into the core that enqueued a request (the dispatch pass it "
        "starts included), by the request's outcome when it returned (NotYetFinalized: "
        "it waits in a queue).",
        ("fairness_id", "priority", "outcome"),
        CYCLE_BUCKETS,
        Twin(EXTENSION + "flow_control_request_enqueue_duration_seconds"),
    ),
    Spec(
        P + "flow_control_dispatch_cycle_duration_seconds",
        H,
        "Time of each dispatch cycle: one call into the core (an arrival, a completion, a "
        "cancellation, a reload, a poke) that dispatches as much as it can.",
        buckets=CYCLE_BUCKETS,
        twin=Twin(EXTENSION + "flow_control_dispatch_cycle_duration_seconds"),
    ),
    Spec(
        P + "flow_control_requests_total",
        C,
        "Requests that left flow control, by outcome.",
        ("outcome", "priority", "inference_pool"),
    ),
    Spec(
        P + "flow_control_queue_size",
        G,
        "Requests waiting in flow control's queues.",
        QUEUE,
        twin=Twin(EXTENSION + "flow_control_queue_size"),
    ),
    Spec(
        P + "flow_control_queue_bytes",
        G,
        "Bytes of the requests waiting in flow control's queues.",
        QUEUE,
        twin=Twin(EXTENSION + "flow_control_queue_bytes"),
    ),
    Spec(
        P + "scheduler_attempts_total",
        C,
        "Scheduling outcomes: success with the endpoint, or failure.",
        ("status", "target_model_name", "endpoint_name", "namespace", "port"),
        twin=Twin(
            EXTENSION + "scheduler_attempts_total",
            rename=MappingProxyType({"endpoint_name": "pod_name"}),
        ),
    ),
    Spec(
        P + "scheduler_e2e_duration_seconds",
        H,
        "Time the scheduler took to choose an endpoint, per call.",
        buckets=SCHEDULER_BUCKETS,
        twin=Twin(EXTENSION + "scheduler_e2e_duration_seconds"),
    ),
    Spec(
        P + "plugin_duration_seconds",
        H,
        "Plugin processing latency per extension point, plugin type and plugin name.",
        ("extension_point", "plugin_type", "plugin_name"),
        SCHEDULER_BUCKETS,
        Twin(EXTENSION + "plugin_duration_seconds"),
    ),
    Spec(
        P + "disagg_decision_total",
        C,
        "Disaggregation decisions of dispatched requests.",
        ("plugin_name", "plugin_type", "model_name", "decision_type"),
        twin=Twin(SCHEDULER + "disagg_decision_total", ("model_name", "decision_type")),
    ),
    Spec(
        P + "info",
        G,
        "The build of this EPP.",
        ("commit", "build_ref"),
        twin=Twin(EXTENSION + "info"),
    ),
    Spec(
        P + "flow_control_pool_saturation",
        G,
        "The pool's saturation: effective as the gate sees it (1.0 and above: "
        "saturated); prefill and decode over each stage's endpoints.",
        POOL_STAGE,
        twin=Twin(EXTENSION + "flow_control_pool_saturation"),
    ),
    Spec(
        P + "flow_control_stale_endpoints",
        G,
        "Endpoints whose metrics are missing or older than the staleness threshold "
        "(scored as saturated).",
        ("detector",),
    ),
    Spec(
        "epp_flow_control_queue_size_by_stage",
        G,
        "Requests waiting in flow control, by the stage that holds the queue: decode or "
        "prefill (the request at the head waits for that stage's room), effective (the "
        "gate is closed).",
        POOL_STAGE,
    ),
    Spec(
        P + "flow_control_endpoint_limit",
        G,
        "The in-flight limit the adaptive gate learned for the endpoint.",
        LIMIT,
    ),
    Spec(
        P + "flow_control_endpoint_headroom",
        G,
        "Slots of the endpoint's limit that only the top priority band may use.",
        LIMIT,
    ),
    Spec(
        P + "flow_control_endpoint_limit_adjustments_total",
        C,
        "Changes of the endpoint's learned in-flight limit.",
        LIMIT,
    ),
    Spec(
        "epp_flow_control_credits_in_use",
        G,
        "In-flight credits held, per stage: decode (the endpoint a request is sent "
        "to) and prefill (its prefill endpoint, until its prefill is over).",
        POOL_STAGE,
    ),
    Spec(
        P + "ready_endpoints",
        G,
        "Endpoints with fresh metrics.",
        ("name",),
        twin=Twin(POOL + "ready_pods"),
    ),
    *_pool_average("kv_cache_utilization"),
    *_pool_average("queue_size"),
    *_pool_average("running_requests"),
    Spec(
        P + "per_endpoint_queue_size",
        G,
        "Requests waiting in each endpoint's queue.",
        PER_ENDPOINT,
        twin=Twin(
            POOL + "per_pod_queue_size",
            rename=MappingProxyType({"model_server_endpoint": "model_server_pod"}),
            help=f"[Deprecated: use {P}per_endpoint_queue_size] Requests waiting in each "
            "pod's queue.",
        ),
    ),
    Spec(
        "epp_per_endpoint_kv_cache_utilization",
        G,
        "KV-cache use of each endpoint.",
        PER_ENDPOINT,
    ),
    Spec(
        "epp_per_endpoint_running_requests",
        G,
        "Requests running at each endpoint.",
        PER_ENDPOINT,
    ),
    Spec(
        "epp_per_endpoint_metrics_age_seconds",
        G,
        "Age of the EPP's latest read of each endpoint.",
        PER_ENDPOINT,
    ),
    Spec(
        "epp_model_server_scrape_failures_total",
        C,
        "Failed reads of model servers' metrics pages, by reason.",
        ("reason",),
    ),
    Spec(
        P + "datalayer_poll_errors_total",
        C,
        "Data-source poll errors per source type.",
        ("source_type",),
        twin=Twin(SCHEDULER + "datalayer_poll_errors_total"),
    ),
    Spec(
        P + "datalayer_extract_errors_total",
        C,
        "Extract errors per source/extractor type.",
        ("source_type", "extractor_type"),
        twin=Twin(SCHEDULER + "datalayer_extract_errors_total"),
    ),
    Spec(
        "epp_transport_limit_trips_total",
        C,
        "Times a transport limit was hit, by port and limit (see the README's limits).",
        ("port", "limit"),
    ),
    Spec(
        "epp_transport_connections",
        G,
        "Open HTTP/2 connections, by port.",
        ("port",),
    ),
    _index_counter("admissions", "Total number of KV-block admissions"),
    _index_counter("evictions", "Total number of KV-block evictions"),
    _index_counter("lookup_requests", "Total number of lookup calls"),
    _index_counter("lookup_hits", "Contiguous prefix blocks matched by the best pod per lookup"),
    _index_counter(
        "max_pod_hit_count", "Longest contiguous per-pod prefix chain observed per lookup"
    ),
    Spec(
        P + "kv_cache_index_lookup_latency_seconds",
        H,
        "Latency of Lookup calls in seconds.",
        buckets=LOOKUP_BUCKETS,
        twin=Twin(
            KVCACHE_INDEX + "lookup_latency_seconds",
            help=f"Deprecated: use {P}kv_cache_index_lookup_latency_seconds. Latency of "
            "Lookup calls in seconds",
        ),
    ),
    Spec(
        P + "kv_cache_index_blocks",
        G,
        "Block keys the precise index holds (some endpoint reported storing each).",
    ),
    Spec(
        P + "kv_cache_index_capacity_blocks",
        G,
        "The precise index's limit in block keys (inMemoryConfig.size); past it the least "
        "recently stored key is evicted.",
    ),
    Spec(
        P + "kv_cache_index_removals_unknown_total",
        C,
        "BlockRemoved events for blocks the endpoint was not known to hold.",
    ),
    Spec(
        P + "kv_cache_events_active_subscribers",
        G,
        "Number of ZMQ subscribers currently managed, including those retrying a failed "
        "connection.",
    ),
    Spec(
        P + "kv_cache_events_subscriber_reconnections_total",
        C,
        "Times a subscriber's publisher came back after a disconnection (its blocks are "
        "dropped and replayed).",
        POD,
    ),
    Spec(
        P + "kv_cache_events_messages_received_total",
        C,
        "Total number of messages received from ZMQ subscribers.",
        POD,
    ),
    Spec(
        P + "kv_cache_events_zmq_errors_total",
        C,
        "Total number of ZMQ subscriber errors.",
        (*POD, "operation"),
    ),
    Spec(
        P + "kv_cache_events_applied_total",
        C,
        "KV-cache events applied to the precise index, by type.",
        ("type",),
    ),
    Spec(
        P + "kv_cache_events_dropped_total",
        C,
        "KV-cache events or batches dropped, by reason (malformed, unknown-type, "
        "malformed-batch, malformed-frame, unknown-pod).",
        ("reason",),
    ),
    Spec(
        P + "kv_cache_events_sequence_gaps_total",
        C,
        "Batches missing from a publisher's sequence.",
    ),
    Spec(
        P + "kv_cache_events_replays_total",
        C,
        "Replays asked of the servers' replay sockets, by result.",
        ("result",),
    ),
    Spec(
        P + "kv_cache_events_resets_total",
        C,
        "Times a server's blocks were dropped because it restarted or reconnected.",
    ),
    Spec(
        P + "prefix_indexer_size",
        G,
        "Blocks the approximate prefix index holds, over every endpoint.",
        PLUGIN,
        twin=Twin(EXTENSION + "prefix_indexer_size", ()),
    ),
    Spec(
        P + "prefix_indexer_hit_ratio",
        H,
        "Ratio of prefix length matched to total prefix length in the cache lookup, on the "
        "endpoint chosen.",
        PLUGIN,
        HIT_RATIO_BUCKETS,
        Twin(EXTENSION + "prefix_indexer_hit_ratio", ()),
    ),
    Spec(
        P + "prefix_indexer_hit_bytes",
        H,
        "Length of the prefix match in bytes (4 a token) in the cache lookup, on the "
        "endpoint chosen.",
        PLUGIN,
        HIT_BYTES_BUCKETS,
        Twin(EXTENSION + "prefix_indexer_hit_bytes", ()),
    ),
    Spec(
        P + "prefix_predicted_cached_tokens",
        H,
        "Prompt tokens the prefix-cache producer's index predicted cached on the endpoint "
        "chosen, per request.",
        PLUGIN,
        INPUT_TOKEN_BUCKETS,
    ),
    Spec(
        P + "prefix_prompt_tokens",
        H,
        "Prompt tokens of the requests the prefix-cache producer predicted for (the "
        "denominator of the predicted hit rate).",
        PLUGIN,
        INPUT_TOKEN_BUCKETS,
    ),
    Spec(
        P + "token_producer_tokenized_total",
        C,
        "Requests the token-producer tokenized with its backend.",
    ),
    Spec(
        P + "token_producer_fallbacks_total",
        C,
        "Requests scheduled with the estimated token count because the tokenizer timed "
        "out, failed or was busy, by reason.",
        ("reason",),
    ),
    Spec(
        "epp_worker_requests_total",
        C,
        "Requests that reached the core through each protocol worker (--workers).",
        ("worker",),
    ),
    Spec(
        "epp_worker_connections_total",
        C,
        "ext_proc connections handed to each protocol worker (--workers).",
        ("worker",),
    ),
    Spec(
        "epp_worker_restarts_total",
        C,
        "Times each protocol worker was started again after it died (--workers).",
        ("worker",),
    ),
    Spec(
        "epp_replica_degraded",
        G,
        "1 while this replica admits on its own within its share of each endpoint "
        "(--decider: no decider answers), else 0.",
    ),
    Spec(
        "epp_replica_degraded_admissions_total",
        C,
        "Requests this replica dispatched on its own while degraded (--decider).",
    ),
    Spec(
        "epp_replica_joins_total",
        C,
        "Times this replica joined a decider and reported what it runs (--decider).",
    ),
    Spec(
        "epp_replica_frames_refused_total",
        C,
        "Frames refused because they came from an older decider epoch than one seen.",
    ),
    Spec(
        "epp_decider_replicas",
        G,
        "Replicas this decider has heard from, by state: joined, or away with their "
        "share of each endpoint kept aside (--decider-port).",
        ("state",),
    ),
    Spec(
        "epp_decider_epoch",
        G,
        "The epoch this decider writes on its decisions (--decider-port).",
    ),
    Spec(
        "epp_session_bindings",
        G,
        "Sessions bound to an endpoint, per session-affinity plugin (session_id).",
        SESSIONS,
    ),
    Spec(
        "epp_session_bindings_dropped_total",
        C,
        "Session bindings dropped because the plugin held maxSessions of them.",
        SESSIONS,
    ),
)

SPECS: Mapping[str, Spec] = MappingProxyType({spec.name: spec for spec in CATALOGUE})
if len(SPECS) != len(CATALOGUE):
    raise ValueError("a metric is in the catalogue twice")


def spec(name: str) -> Spec:
    """The catalogue's entry for `name` (a KeyError names an uncatalogued metric)."""
    return SPECS[name]


def exposed_names() -> frozenset[str]:
    """Every family name epp may expose: the metrics and their twins."""
    names = {entry.name for entry in CATALOGUE}
    names.update(entry.twin.name for entry in CATALOGUE if entry.twin is not None)
    return frozenset(names)


def markdown_table(catalogue: tuple[Spec, ...] = CATALOGUE) -> str:
    """The docs' metric table: one row per metric, its twin beside it."""
    lines = ["| metric | type | labels | meaning | deprecated twin |", "|---|---|---|---|---|"]
    for entry in catalogue:
        labels = ", ".join(f"`{label}`" for label in entry.labels)
        twin = ""
        if entry.twin is not None:
            twin = f"`{entry.twin.name}`"
            if entry.twin_labels != entry.labels:
                twin += " (" + ", ".join(f"`{label}`" for label in entry.twin_labels) + ")"
        lines.append(f"| `{entry.name}` | {entry.kind.value} | {labels} | {entry.help} | {twin} |")
    return "\n".join(lines)
