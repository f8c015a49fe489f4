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

The declarations share `vocabulary`'s buckets, label sets and prefixes; the
precise prefix cache's family is declared in `prefix_cache` and takes its
place in the list here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from epp.serve.metrics.prefix_cache import PREFIX_CACHE
from epp.serve.metrics.spec import Kind, Spec, Twin
from epp.serve.metrics.vocabulary import (
    CYCLE_BUCKETS,
    DURATION_BUCKETS,
    EXTENSION,
    INPUT_TOKEN_BUCKETS,
    ITL_BUCKETS,
    LIMIT,
    MODEL,
    NTPOT_BUCKETS,
    OBJECTIVE,
    OUTPUT_TOKEN_BUCKETS,
    PER_ENDPOINT,
    POOL,
    POOL_STAGE,
    PROCESSING_BUCKETS,
    QUEUE,
    QUEUE_BUCKETS,
    REQUEST,
    RESPONSE_PROCESSING_BUCKETS,
    RESPONSE_SIZE_BUCKETS,
    SCHEDULER,
    SCHEDULER_BUCKETS,
    SESSIONS,
    SIZE_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    C,
    G,
    H,
    P,
)


def _request(
    name: str, kind: Kind, text: str, twin: str | None, buckets=(), labels=REQUEST, keep=MODEL
):
    return Spec(
        P + name, kind, text, labels, buckets,
        None if twin is None else Twin(OBJECTIVE + twin, keep),
    )  # fmt: skip


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
    *PREFIX_CACHE,
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
