"""Prometheus metrics with the reference EPP's names and labels, served on :9090.

Every series is written under its canonical `llm_d_epp_*` name and, where the
reference keeps one, under its deprecated twin (`inference_objective_*`,
`inference_pool_*`, `inference_extension_*`) with the labels the twin had,
so dashboards of either age find their series (llm-d-router
`docs/metrics.md`, `pkg/epp/metrics/`).

Per request (label children cached per label tuple):
- request and latency, labels `model_name, target_model_name, fairness_id,
  priority` (twins: the two model labels; `request_total` adds `priority`):
  `request_total` and `request_size_bytes` when a request reaches flow
  control, `request_error_total{error_code}` when it is answered with an error
  (the code is the dropped reason, or `bad-request`, `request-too-large`...;
  labels are empty when the body was never parsed), `request_duration_seconds`,
  `request_input_tokens`, `request_output_tokens`, `request_cached_tokens`
  (when the server reports them), `request_ntpot_seconds`,
  `response_size_bytes` at its end, `request_ttft_seconds{streaming}` (to the
  first response body bytes) and `request_streaming_tpot_seconds` (no twins),
  `request_streaming_itl_seconds` (no twin) as each SSE chunk arrives (the
  stream adds to the histogram `chunk_gaps` hands it), `request_running`
  while it runs (twin: `model_name` only);
- `response_processing_duration_seconds` (no twin): the EPP's own time on
  one response, summed over its messages, once per call;
- `request_processing_duration_seconds` (no twin): from the end of the body to
  the flow-control outcome, queue wait included, as the reference measures;
- flow control: `flow_control_request_queue_duration_seconds{fairness_id,
  priority, outcome, inference_pool, model_name, target_model_name}` and
  `flow_control_requests_total{outcome, priority, inference_pool}` (no twin)
  when its stay ends; `flow_control_queue_size` and `_queue_bytes` (the same
  labels less `outcome`) up while it waits in a queue, down when it leaves.
  `outcome` reads the reference's values (`Dispatched`, `RejectedCapacity`,
  `RejectedNoEndpoints`, `RejectedOther`, `EvictedTTL`, `EvictedNoEndpoints`,
  `EvictedContextCancelled`, `EvictedOther`);
- scheduler: `scheduler_attempts_total{status, target_model_name,
  endpoint_name, namespace, port}` (twin: `pod_name` for `endpoint_name`) per
  dispatch (success) or per request no endpoint could take (failure);
  `scheduler_e2e_duration_seconds`, each call of the scheduler, tallied by
  `TimedPlacer` and read at scrape time; `plugin_duration_seconds{
  extension_point, plugin_type, plugin_name}`, each filter, scorer and picker
  call, timed by the wrappers `PluginDurations.timed` gives the scheduler;
- credits (ours, no twin): `epp_flow_control_credits_in_use{inference_pool,
  stage}` at scrape time, `decode` (per-endpoint credits) and, under P/D,
  `prefill` (see `epp.scheduling.stages`);
- disaggregation, with a disaggregating profile handler (`watch_scheduling`):
  `disagg_decision_total{plugin_name, plugin_type, model_name,
  decision_type}` per dispatched request (`decode-only`, `prefill-decode`,
  `encode-decode`, `encode-prefill-decode`; the model is the target model, as
  the reference), twin `llm_d_inference_scheduler_disagg_decision_total`
  (`model_name, decision_type`).

At scrape time: the pool's gauges (`average_kv_cache_utilization`,
`average_queue_size`, `average_running_requests`, `std_dev_*`,
`ready_endpoints` over the endpoints whose metrics are fresh, and
`per_endpoint_queue_size` for every endpoint; labels `name` and
`model_server_endpoint`), and `flow_control_pool_saturation{inference_pool,
stage}`: `effective` as the configured gate sees it, and, with a `StageView`
(`watch_core`), `decode` and `prefill` over each stage's endpoints (the
saturation rule, partitioned by role as the reference does), with
`flow_control_stale_endpoints{detector}` (no twin) and ours,
`epp_flow_control_queue_size_by_stage{inference_pool, stage}`: the queued
requests under the stage whose lack of room holds the queue (`decode`,
`prefill`: the head request waits for that stage's credit; `effective`: the
gate is closed). Besides the reference's, per endpoint with a good latest
read: `epp_per_endpoint_kv_cache_utilization`, `epp_per_endpoint_running_requests`
and `epp_per_endpoint_metrics_age_seconds` (how old the EPP's view is).
From the scraper (`watch_scrapes`): the reference's
`datalayer_poll_errors_total{source_type}` and
`datalayer_extract_errors_total{source_type, extractor_type}` (twins
`llm_d_inference_scheduler_*`), and ours,
`epp_model_server_scrape_failures_total{reason}` (timeout, connection,
http-status, not-prometheus-text, too-large: poll errors; unreadable: an
extract error), kept because the reason is what an operator acts on.
With the adaptive gate (`watch_limits`), per endpoint
(`inference_pool`, `endpoint`; no twin, the reference learns no limit):
`flow_control_endpoint_limit` (the learned in-flight limit),
`flow_control_endpoint_headroom` (its slots only the top band may use) and
`flow_control_endpoint_limit_adjustments_total` (how often it changed).
From the gRPC servers (`watch_transport`):
`epp_transport_limit_trips_total{port,limit}`, each time a transport limit
ended a call or a connection, refused one, or made a connection wait, and
`epp_transport_connections{port}`.
From the `session_id` session-affinity plugins (`watch_sessions`):
`epp_session_bindings{inference_pool,plugin}` and
`epp_session_bindings_dropped_total{inference_pool,plugin}` (bindings
dropped because the plugin held `maxSessions`).

Series are kept as plain numbers per canonical label tuple (`Family`; a
histogram as a `Tally`) and written out under both names at scrape time, the
twin summing the canonical series that share its labels: an update is a dict
lookup and an addition, and a twin costs nothing per request.

Client-chosen label values are capped for the life of the process, as the
reference caps them: at most 1000 `fairness_id` values and 1000 model names
(`model_name` and `target_model_name` together); later ones read `other`.
When the core collects an idle flow, its flow-control series are removed.
"""

from __future__ import annotations

import statistics
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from epp.api.address import parse_address
from epp.extproc.events import Rejected, Release
from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import Placement, Placer
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.endpoint import PoolSnapshot
from epp.scheduling.profiles import ENCODERS_HEADER, PREFILLER_HEADER
from epp.scheduling.request import InferenceRequest
from epp.scheduling.sessions import SessionBindings
from epp.scheduling.spec import PluginSpec
from epp.scheduling.stages import DISAGG_HANDLERS

if TYPE_CHECKING:
    from epp.transport import GrpcServer

OTHER = "other"
LABEL_VALUE_LIMIT = 1000
CURRENT = "llm_d_epp_"

DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
    15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
SIZE_BUCKETS = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144,
    524288, 1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864,
    134217728, 268435456, 536870912, 1073741824,
)  # fmt: skip
INPUT_TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
RESPONSE_SIZE_BUCKETS = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32778,
    65536,
)
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
QUEUE_BUCKETS = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip

MODEL = ("model_name", "target_model_name")
REQUEST = (*MODEL, "fairness_id", "priority")
"""The canonical labels of the request and latency metrics."""
QUEUE = ("fairness_id", "priority", "inference_pool", *MODEL)
QUEUE_DURATION = ("fairness_id", "priority", "outcome", "inference_pool", *MODEL)
ATTEMPT = ("status", "target_model_name", "endpoint_name", "namespace", "port")
PLUGIN = ("extension_point", "plugin_type", "plugin_name")
LEGACY_ATTEMPT = ("status", "target_model_name", "pod_name", "namespace", "port")


def epp_version() -> str:
    try:
        return version("epp")
    except PackageNotFoundError:
        return "unknown"


class BoundedLabel:
    """At most `limit` distinct values of a client-chosen label over the life
    of the process; later ones read `other` (empty stays empty). An admitted
    value always reads itself, so paired up/down updates stay balanced."""

    __slots__ = ("_seen", "limit")

    def __init__(self, limit: int = LABEL_VALUE_LIMIT) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if not value or value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value


class Tally:
    """A histogram kept as plain counts: `add` costs a bisect and three
    additions; scrapes read it."""

    __slots__ = ("buckets", "count", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.count += 1
        self.total += value

    def merge(self, other: Tally) -> None:
        for index, count in enumerate(other.counts):
            self.counts[index] += count
        self.count += other.count
        self.total += other.total

    def cumulative(self) -> list[tuple[str, int]]:
        result, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            result.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return result


class Kind(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Family:
    """One metric's series, kept as plain numbers (a histogram's as a Tally)
    per tuple of its canonical label values, and exposed at scrape time as
    `llm_d_epp_<name>` and, when the reference keeps one, as its deprecated
    twin `legacy`, whose labels are those at `pick` (named `legacy_labels`)
    and whose series sum the canonical series that share them. An update is a
    dict lookup and an addition, whatever the number of names."""

    __slots__ = (
        "buckets", "documentation", "kind", "labels", "legacy", "legacy_labels", "name",
        "pick", "values",
    )  # fmt: skip

    def __init__(
        self,
        kind: Kind,
        name: str,
        documentation: str,
        labels: tuple[str, ...] = (),
        legacy: str | None = None,
        pick: tuple[int, ...] | None = None,
        legacy_labels: tuple[str, ...] | None = None,
        buckets: tuple[float, ...] = (),
    ) -> None:
        self.kind = kind
        self.name = CURRENT + name
        self.documentation = documentation
        self.labels = labels
        self.legacy = legacy
        self.pick = tuple(range(len(labels))) if pick is None else pick
        self.legacy_labels = legacy_labels or tuple(labels[index] for index in self.pick)
        self.buckets = buckets
        self.values: dict[tuple[str, ...], Any] = {}

    def add(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self.values[key] = self.values.get(key, 0.0) + amount

    def observe(self, key: tuple[str, ...], value: float) -> None:
        self.tally(key).add(value)

    def tally(self, key: tuple[str, ...]) -> Tally:
        found = self.values.get(key)
        if found is None:
            found = self.values[key] = Tally(self.buckets)
        return found

    def remove(self, key: tuple[str, ...]) -> None:
        self.values.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        yield self._family(self.name, self.documentation, self.labels, self.values)
        if self.legacy is not None:
            documentation = f"[Deprecated: use {self.name}] {self.documentation}"
            yield self._family(self.legacy, documentation, self.legacy_labels, self._projected())

    def _projected(self) -> dict[tuple[str, ...], Any]:
        merged: dict[tuple[str, ...], Any] = {}
        for key, value in self.values.items():
            legacy_key = tuple(key[index] for index in self.pick)
            if self.kind is Kind.HISTOGRAM:
                if legacy_key not in merged:
                    merged[legacy_key] = Tally(self.buckets)
                merged[legacy_key].merge(value)
            else:
                merged[legacy_key] = merged.get(legacy_key, 0.0) + value
        return merged

    def _family(
        self, name: str, documentation: str, labels: tuple[str, ...], values: dict
    ) -> Metric:
        if self.kind is Kind.HISTOGRAM:
            family: Any = HistogramMetricFamily(name, documentation, labels=labels)
            for key, tally in values.items():
                family.add_metric(list(key), tally.cumulative(), sum_value=tally.total)
            return family
        maker = CounterMetricFamily if self.kind is Kind.COUNTER else GaugeMetricFamily
        family = maker(name, documentation, labels=labels)
        for key, value in values.items():
            family.add_metric(list(key), value)
        return family


class _Families(Collector):
    def __init__(self, families: list[Family]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield from family.collect()


class TimedPlacer:
    """The scheduler, with each `place` call's duration tallied for
    `scheduler_e2e_duration_seconds`."""

    __slots__ = ("placer", "tally")

    def __init__(self, placer: Placer, tally: Tally) -> None:
        self.placer = placer
        self.tally = tally

    def place(self, request: FlowRequest) -> Placement:
        start = time.perf_counter()
        placement = self.placer.place(request)
        self.tally.add(time.perf_counter() - start)
        return placement

    def has_endpoints(self) -> bool:
        return self.placer.has_endpoints()


class PluginDurations:
    """`plugin_duration_seconds`: the scheduler's plugin calls, timed by the
    wrappers `timed` makes (the core's `PluginTimer`). Made before the core
    is built, registered with the metrics after."""

    __slots__ = ("family",)

    def __init__(self) -> None:
        self.family = Family(
            Kind.HISTOGRAM,
            "plugin_duration_seconds",
            "Plugin processing latency per extension point, plugin type and plugin name.",
            PLUGIN,
            "inference_extension_plugin_duration_seconds",
            buckets=SCHEDULER_BUCKETS,
        )

    def timed(
        self, extension_point: str, plugin_type: str, plugin_name: str, call: Callable[..., Any]
    ) -> Callable[..., Any]:
        tally = self.family.tally((extension_point, plugin_type, plugin_name))
        clock = time.perf_counter

        def run(*args: Any) -> Any:
            start = clock()
            result = call(*args)
            tally.add(clock() - start)
            return result

        return run


def _models(request: FlowRequest | None) -> tuple[str, str]:
    payload = request.payload if request is not None else None
    if isinstance(payload, InferenceRequest):
        return payload.model, payload.target_model
    return "", ""


def decision_type(routing: dict[str, str] | None) -> str:
    """The reference's name for the stages a dispatched request was sent through."""
    prefill = routing is not None and PREFILLER_HEADER in routing
    encode = routing is not None and ENCODERS_HEADER in routing
    if encode:
        return "encode-prefill-decode" if prefill else "encode-decode"
    return "prefill-decode" if prefill else "decode-only"


def flow_control_outcome(outcome: Outcome, queued: bool) -> str:
    """The reference's name for how a request left flow control: Rejected*
    at the door, Evicted* after waiting in a queue."""
    if outcome is Outcome.DISPATCHED or outcome is Outcome.REJECTED_FILTERED:
        # The reference's flow control dispatched it; its scheduler failed after.
        return "Dispatched"
    if outcome is Outcome.REJECTED_TTL_EXPIRED:
        return "EvictedTTL"
    if outcome is Outcome.REJECTED_NO_ENDPOINTS:
        return "EvictedNoEndpoints" if queued else "RejectedNoEndpoints"
    if outcome is Outcome.CANCELLED:
        return "EvictedContextCancelled" if queued else "RejectedOther"
    if outcome is Outcome.REJECTED_SATURATED and not queued:
        return "RejectedCapacity"
    return "EvictedOther" if queued else "RejectedOther"


class EppMetrics:
    """The EPP's metrics; see the module docstring. `on_outcome`,
    `on_queued`, `on_complete` and `on_flows_collected` plug into the
    AdmissionController, `on_stream_event` into the ext_proc servicer;
    `watch_core` and `watch_pool` add the scrape-time gauges."""

    def __init__(
        self,
        pool_name: str,
        label_limit: int = LABEL_VALUE_LIMIT,
        clock: Callable[[], float] = time.monotonic,
        endpoint_names: Callable[[str], tuple[str, str]] | None = None,
        scheduler_latency: Tally | None = None,
        plugin_durations: PluginDurations | None = None,
    ) -> None:
        self.pool_name = pool_name
        self.registry = CollectorRegistry()
        self.fairness_id = BoundedLabel(label_limit)
        self.model = BoundedLabel(label_limit)
        self._clock = clock
        self._endpoint_names = endpoint_names or (lambda address: ("", ""))
        self._queued: dict[FlowRequest, tuple[str, ...]] = {}
        self._flow_series: defaultdict[FlowKey, set[tuple[Family, tuple[str, ...]]]] = defaultdict(
            set
        )
        """Per flow, the flow-control series it wrote (removed when it is collected)."""
        counter, gauge, histogram = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
        models = (0, 1)
        self.request_total = Family(
            counter,
            "request_total",
            "Requests that reached flow control.",
            REQUEST,
            "inference_objective_request_total",
            (0, 1, 3),
        )
        self.request_errors = Family(
            counter,
            "request_error_total",
            "Requests answered with an error.",
            (*REQUEST, "error_code"),
            "inference_objective_request_error_total",
            (0, 1, 4),
        )
        self.request_duration = Family(
            histogram,
            "request_duration_seconds",
            "From the end of the request body to the end of the response.",
            REQUEST,
            "inference_objective_request_duration_seconds",
            models,
            buckets=DURATION_BUCKETS,
        )
        self.request_size = Family(
            histogram,
            "request_size_bytes",
            "Request body size in bytes.",
            REQUEST,
            "inference_objective_request_sizes",
            models,
            buckets=SIZE_BUCKETS,
        )
        self.input_tokens = Family(
            histogram,
            "request_input_tokens",
            "Prompt tokens the model server reported.",
            REQUEST,
            "inference_objective_input_tokens",
            models,
            buckets=INPUT_TOKEN_BUCKETS,
        )
        self.output_tokens = Family(
            histogram,
            "request_output_tokens",
            "Completion tokens the model server reported.",
            REQUEST,
            "inference_objective_output_tokens",
            models,
            buckets=OUTPUT_TOKEN_BUCKETS,
        )
        self.ntpot = Family(
            histogram,
            "request_ntpot_seconds",
            "Request duration divided by output tokens.",
            REQUEST,
            "inference_objective_normalized_time_per_output_token_seconds",
            models,
            buckets=NTPOT_BUCKETS,
        )
        self.response_size = Family(
            histogram,
            "response_size_bytes",
            "Response body size in bytes.",
            REQUEST,
            "inference_objective_response_sizes",
            models,
            buckets=RESPONSE_SIZE_BUCKETS,
        )
        self.cached_tokens = Family(
            histogram,
            "request_cached_tokens",
            "Prompt tokens read from the model server's cache, as its response reported.",
            REQUEST,
            "inference_objective_prompt_cached_tokens",
            models,
            buckets=INPUT_TOKEN_BUCKETS,
        )
        self.ttft = Family(
            histogram,
            "request_ttft_seconds",
            "From the end of the request body to the first response body bytes.",
            (*REQUEST, "streaming"),
            buckets=TTFT_BUCKETS,
        )
        self.streaming_tpot = Family(
            histogram,
            "request_streaming_tpot_seconds",
            "Time per output token after the first, of streamed responses.",
            REQUEST,
            buckets=TPOT_BUCKETS,
        )
        self.streaming_itl = Family(
            histogram,
            "request_streaming_itl_seconds",
            "Time between consecutive response body chunks of streamed responses.",
            REQUEST,
            buckets=ITL_BUCKETS,
        )
        self.running = Family(
            gauge,
            "request_running",
            "Requests dispatched and not finished.",
            REQUEST,
            "inference_objective_running_requests",
            (0,),
        )
        self.processing = Family(
            histogram,
            "request_processing_duration_seconds",
            "From the end of the request body to its flow-control outcome, queue wait included.",
            buckets=PROCESSING_BUCKETS,
        )
        self.response_processing = Family(
            histogram,
            "response_processing_duration_seconds",
            "The EPP's own time on a response: the sum of its handling of each response "
            "message (the waits between them are the model server's).",
            buckets=RESPONSE_PROCESSING_BUCKETS,
        )
        self.queue_duration = Family(
            histogram,
            "flow_control_request_queue_duration_seconds",
            "Time a request spent in flow control, by how it left.",
            QUEUE_DURATION,
            "inference_extension_flow_control_request_queue_duration_seconds",
            buckets=QUEUE_BUCKETS,
        )
        self.flow_control_total = Family(
            counter,
            "flow_control_requests_total",
            "Requests that left flow control, by outcome.",
            ("outcome", "priority", "inference_pool"),
        )
        self.queue_size = Family(
            gauge,
            "flow_control_queue_size",
            "Requests waiting in flow control's queues.",
            QUEUE,
            "inference_extension_flow_control_queue_size",
        )
        self.queue_bytes = Family(
            gauge,
            "flow_control_queue_bytes",
            "Bytes of the requests waiting in flow control's queues.",
            QUEUE,
            "inference_extension_flow_control_queue_bytes",
        )
        self.attempts = Family(
            counter,
            "scheduler_attempts_total",
            "Scheduling outcomes: success with the endpoint, or failure.",
            ATTEMPT,
            "inference_extension_scheduler_attempts_total",
            legacy_labels=LEGACY_ATTEMPT,
        )
        self.scheduler_e2e = Family(
            histogram,
            "scheduler_e2e_duration_seconds",
            "Time the scheduler took to choose an endpoint, per call.",
            (),
            "inference_extension_scheduler_e2e_duration_seconds",
            buckets=SCHEDULER_BUCKETS,
        )
        self.scheduler_latency = self.scheduler_e2e.values[()] = scheduler_latency or Tally(
            SCHEDULER_BUCKETS
        )
        self.disagg_decisions = Family(
            counter,
            "disagg_decision_total",
            "Disaggregation decisions of dispatched requests.",
            ("plugin_name", "plugin_type", "model_name", "decision_type"),
            "llm_d_inference_scheduler_disagg_decision_total",
            (2, 3),
        )
        self.disagg_handler: tuple[str, str] | None = None
        """The profile handler's (name, type) when it disaggregates."""
        info = Family(
            gauge,
            "info",
            "The build of this EPP.",
            ("commit", "build_ref"),
            "inference_extension_info",
        )
        info.add((epp_version(), "epp"))
        self.plugin_durations = plugin_durations or PluginDurations()
        self.registry.register(
            _Families([
                self.request_total, self.request_errors, self.request_duration,
                self.request_size, self.input_tokens, self.output_tokens, self.cached_tokens,
                self.ntpot, self.response_size, self.ttft, self.streaming_tpot,
                self.streaming_itl, self.running, self.processing, self.response_processing,
                self.queue_duration, self.flow_control_total, self.queue_size,
                self.queue_bytes, self.attempts, self.scheduler_e2e,
                self.plugin_durations.family, self.disagg_decisions, info,
            ])
        )  # fmt: skip

    # -- hooks -------------------------------------------------------------------

    def _request_labels(self, request: FlowRequest | None) -> tuple[str, str, str, str]:
        model, target = _models(request)
        if request is None:
            return self.model(model), self.model(target), "", ""
        return (
            self.model(model),
            self.model(target),
            self.fairness_id(request.fairness_id),
            str(request.priority),
        )

    def on_queued(self, request: FlowRequest) -> None:
        """The request waits in a queue (it was not decided at once)."""
        model, target, fairness_id, priority = self._request_labels(request)
        labels = (fairness_id, priority, self.pool_name, model, target)
        self._queued[request] = labels
        self.queue_size.add(labels)
        self.queue_bytes.add(labels, request.byte_size)
        series = self._flow_series[FlowKey(request.fairness_id, request.priority)]
        series.add((self.queue_size, labels))
        series.add((self.queue_bytes, labels))

    def on_outcome(self, request: FlowRequest, now: float) -> None:
        outcome = request.outcome
        if outcome is None:
            return
        queued_labels = self._queued.pop(request, None)
        if queued_labels is not None:
            self.queue_size.add(queued_labels, -1)
            self.queue_bytes.add(queued_labels, -request.byte_size)
        labels = self._request_labels(request)
        model, target, fairness_id, priority = labels
        self.request_total.add(labels)
        self.request_size.observe(labels, request.byte_size)
        waited = max(0.0, now - request.arrival)
        self.processing.observe((), waited)
        reference_outcome = flow_control_outcome(outcome, queued_labels is not None)
        flow = (fairness_id, priority, reference_outcome, self.pool_name, model, target)
        self.queue_duration.observe(flow, waited)
        self._flow_series[FlowKey(request.fairness_id, request.priority)].add(
            (self.queue_duration, flow)
        )
        self.flow_control_total.add((reference_outcome, priority, self.pool_name))
        if outcome.is_dispatched:
            if model:
                self.running.add(labels)
            self._attempt("success", target, request.endpoint)
            handler = self.disagg_handler
            if handler is not None:
                payload = request.payload
                decision = decision_type(payload.routing if payload is not None else None)
                self.disagg_decisions.add((*handler, target, decision))
        elif outcome is Outcome.REJECTED_NO_ENDPOINTS or outcome is Outcome.REJECTED_FILTERED:
            self._attempt("failure", target, None)

    def watch_scheduling(self, handler: PluginSpec) -> None:
        """Count disaggregation decisions when the profile `handler` disaggregates."""
        disaggregates = handler.type in DISAGG_HANDLERS
        self.disagg_handler = (handler.name, handler.type) if disaggregates else None

    def _attempt(self, status: str, target: str, address: str | None) -> None:
        name, namespace, port = "", "", ""
        if address:
            name, namespace = self._endpoint_names(address)
            port = str(parse_address(address)[1])
        self.attempts.add((status, target, name, namespace, port))

    def on_stream_event(self, event: Rejected | Release) -> None:
        labels = self._request_labels(event.request)
        if isinstance(event, Rejected):
            self.request_errors.add((*labels, event.reason))
            return
        now = self._clock()
        arrival = event.request.arrival
        duration = max(0.0, now - arrival)
        self.request_duration.observe(labels, duration)
        if event.response_bytes:
            self.response_size.observe(labels, event.response_bytes)
        if event.input_tokens:
            self.input_tokens.observe(labels, event.input_tokens)
        if event.output_tokens:
            self.output_tokens.observe(labels, event.output_tokens)
            self.ntpot.observe(labels, duration / event.output_tokens)
        if event.cached_tokens is not None:
            self.cached_tokens.observe(labels, event.cached_tokens)
        first = event.first_byte_at
        if first is not None:
            streaming = "true" if event.streaming else "false"
            self.ttft.observe((*labels, streaming), max(0.0, first - arrival))
            tpot = event.time_per_output_token(now)
            if tpot is not None:
                self.streaming_tpot.observe(labels, tpot)

    def chunk_gaps(self, request: FlowRequest) -> Tally:
        """Where the gaps between `request`'s streamed chunks are tallied
        (the ext_proc stream's `chunk_gaps`)."""
        return self.streaming_itl.tally(self._request_labels(request))

    def on_response_processed(self, seconds: float) -> None:
        """The EPP spent `seconds` on one request's response."""
        self.response_processing.observe((), seconds)

    def on_complete(self, request: FlowRequest) -> None:
        """A dispatched request gave its endpoint back (however it ended)."""
        labels = self._request_labels(request)
        if labels[0]:
            self.running.add(labels, -1)

    def on_flows_collected(self, keys: Iterable[FlowKey]) -> None:
        """Remove the flow-control series of flows the core collected (the
        `other` series is shared, so it stays)."""
        for key in keys:
            for family, labels in self._flow_series.pop(key, ()):
                if labels[0] != OTHER:
                    family.remove(labels)

    def watch_core(self, saturation: Callable[[], float], stages: StageView | None = None) -> None:
        """Report the pool's saturation as the gate sees it, and with
        `stages` per stage, the stale endpoints and the queue by the stage
        holding it, at scrape time."""
        self.registry.register(_SaturationCollector(self.pool_name, saturation, stages))

    def watch_limits(self, gate: AdaptiveGate) -> None:
        """Report the adaptive gate's learned limits at scrape time."""
        self.registry.register(_LimitsCollector(self.pool_name, gate))

    def watch_credits(self, in_flight: Callable[[], dict[str, int]]) -> None:
        """Report the in-flight credits in use per stage (`decode`, and
        `prefill` under P/D), at scrape time: `epp_flow_control_credits_in_use`."""
        self.registry.register(_CreditsCollector(self.pool_name, in_flight))

    def watch_pool(
        self,
        snapshot: Callable[[], PoolSnapshot],
        staleness: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Report the pool's gauges from the endpoints' metrics, at scrape time."""
        self.registry.register(_PoolCollector(self.pool_name, snapshot, staleness, clock))

    def watch_scrapes(self, failures: Callable[[], Mapping[str, int]]) -> None:
        """Report the scraper's failed reads, by reason, at scrape time."""
        self.registry.register(_ScrapeFailures(failures))

    def watch_transport(self, servers: Mapping[str, GrpcServer]) -> None:
        """Report each gRPC port's open connections and limit trips at scrape time."""
        self.registry.register(_TransportCollector(servers))

    def watch_sessions(self, stores: Callable[[], Mapping[str, SessionBindings]]) -> None:
        """Report the session bindings per plugin, and how many its limit
        dropped, at scrape time."""
        self.registry.register(_SessionsCollector(self.pool_name, stores))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


METRICS_SOURCE = "metrics-data-source"
METRICS_EXTRACTOR = "core-metrics-extractor"
EXTRACT_FAILURES = frozenset({"unreadable"})
"""The scrape failure reasons where the page was read but not understood: the
reference counts those as extract errors, the rest as poll errors."""


class _ScrapeFailures(Collector):
    """The reference's data-layer error counters (poll: the page could not be
    read; extract: read, not understood), with their deprecated
    `llm_d_inference_scheduler_*` twins, and ours by reason, which tells a
    timeout from a refused connection or a wrong path."""

    def __init__(self, failures: Callable[[], Mapping[str, int]]) -> None:
        self._failures = failures

    def collect(self) -> Iterator[Metric]:
        by_reason = CounterMetricFamily(
            "epp_model_server_scrape_failures",
            "Failed reads of model servers' metrics pages, by reason.",
            labels=["reason"],
        )
        failures = self._failures()
        polls = extracts = 0
        for reason, count in sorted(failures.items()):
            by_reason.add_metric([reason], count)
            if reason in EXTRACT_FAILURES:
                extracts += count
            else:
                polls += count
        yield by_reason
        for name, text, labels, value in (
            ("datalayer_poll_errors", "Data-source poll errors per source type.",
             [METRICS_SOURCE], polls),
            ("datalayer_extract_errors", "Extract errors per source/extractor type.",
             [METRICS_SOURCE, METRICS_EXTRACTOR], extracts),
        ):  # fmt: skip
            label_names = ["source_type", "extractor_type"][: len(labels)]
            for family_name, documentation in (
                (CURRENT + name, text),
                (f"llm_d_inference_scheduler_{name}", f"[Deprecated: use {CURRENT}{name}] {text}"),
            ):
                family = CounterMetricFamily(family_name, documentation, labels=label_names)
                family.add_metric(labels, value)
                yield family


def _twins(name: str, legacy: str | None, documentation: str, labels: list[str]):
    """A gauge family under `llm_d_epp_<name>` and, if any, its deprecated twin."""
    families = [GaugeMetricFamily(CURRENT + name, documentation, labels=labels)]
    if legacy is not None:
        families.append(
            GaugeMetricFamily(
                legacy, f"[Deprecated: use {CURRENT}{name}] {documentation}", labels=labels
            )
        )
    return families


@dataclass(slots=True, frozen=True)
class StageView:
    """What the pool-saturation collector reads per stage, at scrape time."""

    saturation: Callable[[], Mapping[str, float]]
    """Each stage's saturation (`decode`, and `prefill` when the pool has
    prefill endpoints)."""
    stale: Callable[[], tuple[str, int]]
    """(who reads staleness, how many endpoints' metrics are stale)."""
    queued: Callable[[], Mapping[str, int]]
    """The queued requests by the stage whose lack of room holds them."""


class _SaturationCollector(Collector):
    def __init__(
        self, pool_name: str, saturation: Callable[[], float], stages: StageView | None
    ) -> None:
        self._pool_name = pool_name
        self._saturation = saturation
        self._stages = stages

    def collect(self) -> Iterator[Metric]:
        readings = {"effective": self._saturation()}
        stages = self._stages
        if stages is not None:
            readings.update(stages.saturation())
        for family in _twins(
            "flow_control_pool_saturation",
            "inference_extension_flow_control_pool_saturation",
            "The pool's saturation: effective as the gate sees it (1.0 and above: "
            "saturated); prefill and decode over each stage's endpoints.",
            ["inference_pool", "stage"],
        ):
            for stage, value in readings.items():
                family.add_metric([self._pool_name, stage], value)
            yield family
        if stages is None:
            return
        reader, count = stages.stale()
        stale = GaugeMetricFamily(
            CURRENT + "flow_control_stale_endpoints",
            "Endpoints whose metrics are missing or older than the staleness threshold "
            "(scored as saturated).",
            labels=["detector"],
        )
        stale.add_metric([reader], count)
        yield stale
        queued = GaugeMetricFamily(
            "epp_flow_control_queue_size_by_stage",
            "Requests waiting in flow control, by the stage that holds the queue: decode or "
            "prefill (the request at the head waits for that stage's room), effective (the "
            "gate is closed).",
            labels=["inference_pool", "stage"],
        )
        for stage, count in stages.queued().items():
            queued.add_metric([self._pool_name, stage], count)
        yield queued


class _LimitsCollector(Collector):
    def __init__(self, pool_name: str, gate: AdaptiveGate) -> None:
        self._pool_name = pool_name
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        labels = ["inference_pool", "endpoint"]
        limit = GaugeMetricFamily(
            "llm_d_epp_flow_control_endpoint_limit",
            "The in-flight limit the adaptive gate learned for the endpoint.",
            labels=labels,
        )
        headroom = GaugeMetricFamily(
            "llm_d_epp_flow_control_endpoint_headroom",
            "Slots of the endpoint's limit that only the top priority band may use.",
            labels=labels,
        )
        adjustments = CounterMetricFamily(
            "llm_d_epp_flow_control_endpoint_limit_adjustments",
            "Changes of the endpoint's learned in-flight limit.",
            labels=labels,
        )
        gate = self._gate
        for address, count in gate.adjustments().items():
            where = [self._pool_name, address]
            limit.add_metric(where, gate.limit_of(address))
            headroom.add_metric(where, gate.headroom_of(address))
            adjustments.add_metric(where, count)
        yield limit
        yield headroom
        yield adjustments


class _CreditsCollector(Collector):
    def __init__(self, pool_name: str, in_flight: Callable[[], dict[str, int]]) -> None:
        self._pool_name = pool_name
        self._in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "epp_flow_control_credits_in_use",
            "In-flight credits held, per stage: decode (the endpoint a request is sent "
            "to) and prefill (its prefill endpoint, until its prefill is over).",
            labels=["inference_pool", "stage"],
        )
        for stage, count in self._in_flight().items():
            family.add_metric([self._pool_name, stage], count)
        yield family


class _SessionsCollector(Collector):
    def __init__(self, pool_name: str, stores: Callable[[], Mapping[str, SessionBindings]]) -> None:
        self._pool_name = pool_name
        self._stores = stores

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "epp_session_bindings",
            "Sessions bound to an endpoint, per session-affinity plugin (session_id).",
            labels=["inference_pool", "plugin"],
        )
        dropped = CounterMetricFamily(
            "epp_session_bindings_dropped",
            "Session bindings dropped because the plugin held maxSessions of them.",
            labels=["inference_pool", "plugin"],
        )
        for name, bindings in sorted(self._stores().items()):
            held.add_metric([self._pool_name, name], len(bindings))
            dropped.add_metric([self._pool_name, name], bindings.dropped)
        yield held
        yield dropped


class _PoolCollector(Collector):
    """The reference's pool gauges: averages and spreads over the endpoints
    with fresh metrics (`--metrics-staleness-threshold`), their number, and
    each endpoint's queue."""

    def __init__(
        self,
        pool_name: str,
        snapshot: Callable[[], PoolSnapshot],
        staleness: float,
        clock: Callable[[], float],
    ) -> None:
        self._pool_name = pool_name
        self._snapshot = snapshot
        self._staleness = staleness
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        pool = self._snapshot()
        now = self._clock()
        fresh = [e.metrics for e in pool.endpoints if not e.metrics.is_stale(now, self._staleness)]
        name = [self._pool_name]
        for family in _twins(
            "ready_endpoints",
            "inference_pool_ready_pods",
            "Endpoints with fresh metrics.",
            ["name"],
        ):
            family.add_metric(name, len(fresh))
            yield family
        if fresh:
            for field, noun in (
                ("kv_usage", "kv_cache_utilization"),
                ("waiting", "queue_size"),
                ("running", "running_requests"),
            ):
                values = [getattr(metrics, field) for metrics in fresh]
                for family in _twins(
                    f"average_{noun}",
                    f"inference_pool_average_{noun}",
                    f"Mean {noun.replace('_', ' ')} of the pool's endpoints.",
                    ["name"],
                ):
                    family.add_metric(name, statistics.fmean(values))
                    yield family
                for family in _twins(
                    f"std_dev_{noun}",
                    None,
                    f"Spread of {noun.replace('_', ' ')} over the endpoints.",
                    ["name"],
                ):
                    family.add_metric(name, statistics.pstdev(values))
                    yield family
        if pool.endpoints:
            current = GaugeMetricFamily(
                CURRENT + "per_endpoint_queue_size",
                "Requests waiting in each endpoint's queue.",
                labels=["name", "model_server_endpoint"],
            )
            legacy = GaugeMetricFamily(
                "inference_pool_per_pod_queue_size",
                f"[Deprecated: use {CURRENT}per_endpoint_queue_size] Requests waiting in each "
                "pod's queue.",
                labels=["name", "model_server_pod"],
            )
            for endpoint in pool.endpoints:
                for family in (current, legacy):
                    family.add_metric([self._pool_name, endpoint.name], endpoint.metrics.waiting)
            yield current
            yield legacy
            yield from self._epp_view(pool, now)

    def _epp_view(self, pool: PoolSnapshot, now: float) -> Iterator[Metric]:
        """What only this EPP reports: per endpoint with a good latest read,
        its KV use, running requests and how old that read is."""
        families = {
            field: GaugeMetricFamily(
                f"epp_per_endpoint_{name}", text, labels=["name", "model_server_endpoint"]
            )
            for field, name, text in (
                ("kv_usage", "kv_cache_utilization", "KV-cache use of each endpoint."),
                ("running", "running_requests", "Requests running at each endpoint."),
                ("age", "metrics_age_seconds", "Age of the EPP's latest read of each endpoint."),
            )
        }
        for endpoint in pool.endpoints:
            metrics = endpoint.metrics
            if metrics.updated_at is None or metrics.failing:
                continue
            labels = [self._pool_name, endpoint.name]
            families["kv_usage"].add_metric(labels, metrics.kv_usage)
            families["running"].add_metric(labels, metrics.running)
            families["age"].add_metric(labels, max(0.0, now - metrics.updated_at))
        yield from families.values()


Authorize = Callable[[str | None, str], Awaitable[int]]
"""(Authorization header, path) -> HTTP status: 200 lets the scrape through
(`epp.k8s.metrics_auth.MetricsAuthorizer.check` is one)."""


class _TransportCollector(Collector):
    def __init__(self, servers: Mapping[str, GrpcServer]) -> None:
        self._servers = servers

    def collect(self) -> Iterator[Metric]:
        trips = CounterMetricFamily(
            "epp_transport_limit_trips",
            "Times a transport limit was hit, by port and limit (see the README's limits).",
            labels=["port", "limit"],
        )
        connections = GaugeMetricFamily(
            "epp_transport_connections", "Open HTTP/2 connections, by port.", labels=["port"]
        )
        for port, server in self._servers.items():
            connections.add_metric([port], len(server.connections))
            for limit, count in sorted(server.trips.items()):
                trips.add_metric([port, limit], count)
        yield trips
        yield connections


async def serve_metrics(
    metrics: EppMetrics, host: str, port: int, authorize: Authorize | None = None
) -> tuple[web.AppRunner, int]:
    """Serve `/metrics` on `host:port` (0 picks a free port) in this event
    loop, so scrapes read the core without locks; with `authorize`, only to
    requests it answers 200. Returns the runner (call `cleanup()` to stop)
    and the bound port."""

    async def handle(request: web.Request) -> web.Response:
        if authorize is not None:
            status = await authorize(request.headers.get("Authorization"), request.path)
            if status != 200:
                return web.Response(status=status, text=HTTPStatus(status).phrase + "\n")
        return web.Response(
            body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]
