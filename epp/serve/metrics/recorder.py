"""The per-request metrics, written by the hooks the admission controller
and the ext_proc servicer call (`EppMetrics`), and the timers the
scheduler's placer and plugins run in (`TimedPlacer`, `PluginDurations`).

When each is written:
- `request_total` and `request_size_bytes` when a request reaches its
  flow-control outcome; `request_error_total{error_code}` when it is
  answered with an error, with the reference's code for the status
  (`BadRequest`, `ResourceExhausted`, `ServiceUnavailable`, `Internal`;
  labels are empty when the body was never parsed), and with
  `ModelServerError` when the model server answered with a non-2xx status;
  `request_duration_seconds`, the token and size histograms,
  `request_ntpot_seconds` at its end; `request_ttft_seconds{streaming}` to
  the first response body bytes and `request_streaming_tpot_seconds`;
  `request_streaming_itl_seconds` as each SSE chunk arrives (the stream adds
  to the tally `chunk_gaps` hands it); `request_running` while it runs;
- `request_processing_duration_seconds`: from the end of the body to the
  flow-control outcome, queue wait included, as the reference measures;
  `response_processing_duration_seconds`: the EPP's own time on one
  response, summed over its messages;
- flow control: `flow_control_request_enqueue_duration_seconds` per arrival
  and `flow_control_dispatch_cycle_duration_seconds` per call into the core
  (the admission controller times them); `flow_control_request_queue_duration_seconds`
  and `flow_control_requests_total` when its stay ends, with the reference's
  outcome names; `flow_control_queue_size` and `_queue_bytes` up while it
  waits in a queue, down when it leaves;
- scheduler: `scheduler_attempts_total` per dispatch (success) or per
  request no endpoint could take (failure); `scheduler_e2e_duration_seconds`
  per call of the scheduler (`TimedPlacer`); `plugin_duration_seconds` per
  filter, scorer and picker call (`PluginDurations.timed`);
  `disagg_decision_total` per dispatched request under a disaggregating
  profile handler (the model is the target model, as the reference's).

Client-chosen label values are capped for the life of the process, as the
reference caps them: at most 1000 `fairness_id` values and 1000 model names
(`model_name` and `target_model_name` together); later ones read `other`.
When the core collects an idle flow, its flow-control series are removed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from epp.api.address import parse_address
from epp.extproc.events import Rejected, Release
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.gate import Placement, Placer
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.cache_scorers import APPROX_PRODUCER
from epp.scheduling.profiles import ENCODERS_HEADER, PREFILLER_HEADER
from epp.scheduling.request import InferenceRequest, PrefixMatch
from epp.scheduling.spec import PluginSpec
from epp.scheduling.stages import DISAGG_HANDLERS
from epp.serve.metrics.series import LABEL_VALUE_LIMIT, OTHER, BoundedLabel, Family, Tally
from epp.serve.metrics.shipping import Merge
from epp.serve.metrics.vocabulary import SCHEDULER_BUCKETS, P

OutcomeFields = list[Any]
"""`RequestMetrics.outcome_fields`: [queued, seconds to the outcome, the
endpoint's [name, namespace] or None, the prefix match's fields or None]."""


def epp_version() -> str:
    try:
        return version("epp")
    except PackageNotFoundError:
        return "unknown"


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
        self.family = Family(P + "plugin_duration_seconds")

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


ERROR_CODES = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    412: "PreconditionFailed",
    429: "ResourceExhausted",
    500: "Internal",
    503: "ServiceUnavailable",
}
"""The reference's error codes by the HTTP status it answers each with
(llm-d-router `pkg/common/error/error.go`, `BuildErrResponse`)."""
MODEL_SERVER_ERROR = "ModelServerError"
"""The reference's code for a response the model server sent with a non-2xx status."""


def error_code(status: int) -> str:
    """The reference's `error_code` for a request epp answered with `status`;
    a 4xx it has no code for (413, 431) is the client's: BadRequest."""
    code = ERROR_CODES.get(status)
    if code is not None:
        return code
    return "BadRequest" if 400 <= status < 500 else "Unknown"


NOT_FINALIZED = "NotYetFinalized"
"""The reference's enqueue outcome of a request left waiting in a queue."""


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


class RequestMetrics:
    """The per-request families and the hooks that write them; see the
    module docstring. `on_outcome`, `on_queued`, `on_complete` and
    `on_flows_collected` plug into the AdmissionController,
    `on_stream_event` into the ext_proc servicer."""

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
        self.fairness_id = BoundedLabel(label_limit)
        self.model = BoundedLabel(label_limit)
        self._clock = clock
        self._endpoint_names = endpoint_names or (lambda address: ("", ""))
        self.streams_here = True
        """False under --workers: the workers record the stream side
        (`stream_families`, `request_running` included) and ship it here."""
        self.flows_here = True
        """False in a protocol worker: the flows are the owner's core's, and
        the owner's page drops a collected flow's series (`merge` notes them)."""
        self._queued: dict[FlowRequest, tuple[str, ...]] = {}
        self._flow_series: defaultdict[FlowKey, set[tuple[Family, tuple[str, ...]]]] = defaultdict(
            set
        )
        """Per flow, the flow-control series it wrote (removed when it is collected)."""
        self.request_total = Family(P + "request_total")
        self.request_errors = Family(P + "request_error_total")
        self.request_duration = Family(P + "request_duration_seconds")
        self.request_size = Family(P + "request_size_bytes")
        self.input_tokens = Family(P + "request_input_tokens")
        self.output_tokens = Family(P + "request_output_tokens")
        self.cached_tokens = Family(P + "request_cached_tokens")
        self.ntpot = Family(P + "request_ntpot_seconds")
        self.response_size = Family(P + "response_size_bytes")
        self.ttft = Family(P + "request_ttft_seconds")
        self.streaming_tpot = Family(P + "request_streaming_tpot_seconds")
        self.streaming_itl = Family(P + "request_streaming_itl_seconds")
        self.running = Family(P + "request_running")
        self.processing = Family(P + "request_processing_duration_seconds")
        self.response_processing = Family(P + "response_processing_duration_seconds")
        self.queue_duration = Family(P + "flow_control_request_queue_duration_seconds")
        self.flow_control_total = Family(P + "flow_control_requests_total")
        self.enqueue_duration = Family(P + "flow_control_request_enqueue_duration_seconds")
        self.dispatch_cycle = Family(P + "flow_control_dispatch_cycle_duration_seconds")
        self.cycles = self.dispatch_cycle.tally(())
        self.queue_size = Family(P + "flow_control_queue_size")
        self.queue_bytes = Family(P + "flow_control_queue_bytes")
        self.attempts = Family(P + "scheduler_attempts_total")
        self.scheduler_e2e = Family(P + "scheduler_e2e_duration_seconds")
        self.scheduler_latency = self.scheduler_e2e.values[()] = scheduler_latency or Tally(
            SCHEDULER_BUCKETS
        )
        self.disagg_decisions = Family(P + "disagg_decision_total")
        self.prefix_hit_ratio = Family(P + "prefix_indexer_hit_ratio")
        self.prefix_hit_bytes = Family(P + "prefix_indexer_hit_bytes")
        self.prefix_predicted = Family(P + "prefix_predicted_cached_tokens")
        self.prefix_prompt = Family(P + "prefix_prompt_tokens")
        self.kv_lookups = Family(P + "kv_cache_index_lookup_latency_seconds")
        self.disagg_handler: tuple[str, str] | None = None
        """The profile handler's (name, type) when it disaggregates."""
        info = Family(P + "info")
        info.add((epp_version(), "epp"))
        self.plugin_durations = plugin_durations or PluginDurations()
        self.registry = CollectorRegistry()
        """The registry `/metrics` writes out (the scrape-time collectors join it)."""
        self.registry.register(_Families([
            self.request_total, self.request_errors, self.request_duration,
            self.request_size, self.input_tokens, self.output_tokens, self.cached_tokens,
            self.ntpot, self.response_size, self.ttft, self.streaming_tpot,
            self.streaming_itl, self.running, self.processing, self.response_processing,
            self.queue_duration, self.enqueue_duration, self.dispatch_cycle,
            self.flow_control_total, self.queue_size,
            self.queue_bytes, self.attempts, self.scheduler_e2e,
            self.plugin_durations.family, self.disagg_decisions, info,
            self.prefix_hit_ratio, self.prefix_hit_bytes, self.prefix_predicted,
            self.prefix_prompt, self.kv_lookups,
        ]))  # fmt: skip

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

    def on_enqueued(self, request: FlowRequest, seconds: float) -> None:
        """The core's call that enqueued `request` took `seconds`."""
        outcome = request.outcome
        fairness_id = self.fairness_id(request.fairness_id)
        labels = (
            fairness_id,
            str(request.priority),
            NOT_FINALIZED if outcome is None else flow_control_outcome(outcome, queued=False),
        )
        self._flow_tally(self.enqueue_duration, labels, request).add(seconds)

    def _flow_tally(self, family: Family, labels: tuple[str, ...], request: FlowRequest) -> Tally:
        """The tally of a flow-control histogram series of `request`'s flow,
        noted as that flow's when new (so collecting the flow removes it)."""
        tally = family.values.get(labels)
        if tally is None:
            tally = family.tally(labels)
            if self.flows_here:
                key = FlowKey(request.fairness_id, request.priority)
                self._flow_series[key].add((family, labels))
        return tally

    def on_dispatch_cycle(self, seconds: float) -> None:
        """One call into the core (a dispatch cycle) took `seconds`."""
        self.cycles.add(seconds)

    def on_outcome(self, request: FlowRequest, now: float) -> None:
        """A request reached its flow-control outcome in this process."""
        fields = self.outcome_fields(request, now)
        if fields is not None:
            self.record_outcome(request, fields)

    def outcome_fields(self, request: FlowRequest, now: float) -> OutcomeFields | None:
        """The decider's side of `request`'s outcome (its queue gauges leave,
        the disaggregation decision), and what only the decider knows of the
        rest, as `record_outcome` takes it: whether it waited in a queue,
        how long it took, the endpoint's (name, namespace), the prefix match
        as `PrefixMatch`'s fields. None: it has no outcome yet."""
        outcome = request.outcome
        if outcome is None:
            return None
        queued_labels = self._queued.pop(request, None)
        if queued_labels is not None:
            self.queue_size.add(queued_labels, -1)
            self.queue_bytes.add(queued_labels, -request.byte_size)
        names = match = None
        if outcome.is_dispatched:
            payload = request.payload
            handler = self.disagg_handler
            if handler is not None:
                decision = decision_type(payload.routing if payload is not None else None)
                self.disagg_decisions.add((*handler, self.model(_models(request)[1]), decision))
            prefix = payload.prefix_match if isinstance(payload, InferenceRequest) else None
            if prefix is not None:
                match = [
                    prefix.producer,
                    prefix.producer_type,
                    prefix.matched,
                    prefix.blocks,
                    prefix.block_tokens,
                    prefix.prompt_tokens,
                ]
            if request.endpoint:
                names = self._endpoint_names(request.endpoint)
        return [queued_labels is not None, max(0.0, now - request.arrival), names, match]

    def record_outcome(self, request: FlowRequest, fields: OutcomeFields) -> None:
        """The rest of `request`'s outcome series, from what `outcome_fields`
        gave (in this process, or in the decider, sent with the decision)."""
        queued, waited, names, match = fields
        outcome = request.outcome
        assert outcome is not None
        labels = self._request_labels(request)
        model, target, fairness_id, priority = labels
        self.request_total.add(labels)
        self.request_size.observe(labels, request.byte_size)
        self.processing.observe((), waited)
        reference_outcome = flow_control_outcome(outcome, queued)
        flow = (fairness_id, priority, reference_outcome, self.pool_name, model, target)
        self._flow_tally(self.queue_duration, flow, request).add(waited)
        self.flow_control_total.add((reference_outcome, priority, self.pool_name))
        if outcome.is_dispatched:
            if model and self.streams_here:
                self.running.add(labels)
            self._attempt("success", target, request.endpoint, names)
            if match is not None:
                self._prefix_match(PrefixMatch(*match))
        elif outcome is Outcome.REJECTED_NO_ENDPOINTS or outcome is Outcome.REJECTED_FILTERED:
            self._attempt("failure", target, None, None)

    def _prefix_match(self, match: PrefixMatch) -> None:
        """The prefix series of a dispatched request: what its producer's index
        predicted on the endpoint chosen (the approximate producer's ratio
        and bytes too, 4 bytes a token, as the reference reports them)."""
        producer = (match.producer, match.producer_type)
        self.prefix_predicted.observe(producer, match.cached_tokens)
        self.prefix_prompt.observe(producer, match.prompt_tokens)
        if match.producer_type == APPROX_PRODUCER:
            self.prefix_hit_bytes.observe(producer, match.matched * match.block_tokens * 4)
            if match.blocks:
                self.prefix_hit_ratio.observe(producer, match.matched / match.blocks)

    def watch_scheduling(self, handler: PluginSpec) -> None:
        """Count disaggregation decisions when the profile `handler` disaggregates."""
        disaggregates = handler.type in DISAGG_HANDLERS
        self.disagg_handler = (handler.name, handler.type) if disaggregates else None

    def _attempt(
        self, status: str, target: str, address: str | None, names: Sequence[str] | None
    ) -> None:
        name, namespace, port = "", "", ""
        if address:
            if names is not None:
                name, namespace = names
            port = str(parse_address(address)[1])
        self.attempts.add((status, target, name, namespace, port))

    def on_stream_event(self, event: Rejected | Release) -> None:
        labels = self._request_labels(event.request)
        if isinstance(event, Rejected):
            self.request_errors.add((*labels, error_code(event.http_status)))
            return
        status = event.upstream_status
        if status is not None and not 200 <= status < 300:
            self.request_errors.add((*labels, MODEL_SERVER_ERROR))
        now = self._clock()
        arrival = event.request.arrival
        duration = max(0.0, now - arrival)
        self.request_duration.observe(labels, duration)
        if event.response_bytes:
            self.response_size.observe(labels, event.response_bytes)
        usage = event.usage
        if usage is not None:
            if usage.input_tokens:
                self.input_tokens.observe(labels, usage.input_tokens)
            if usage.output_tokens:
                self.output_tokens.observe(labels, usage.output_tokens)
                self.ntpot.observe(labels, duration / usage.output_tokens)
            if usage.cached_tokens is not None:
                self.cached_tokens.observe(labels, usage.cached_tokens)
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
        if not self.streams_here:
            return
        labels = self._request_labels(request)
        if labels[0]:
            self.running.add(labels, -1)

    def on_started(self, request: FlowRequest) -> None:
        """A protocol worker's request was dispatched: it runs until `on_complete`."""
        labels = self._request_labels(request)
        if labels[0]:
            self.running.add(labels)

    def merge(self, *extra: Family) -> Merge:
        """Adds the takes of protocol workers' `shipped_families` (and of
        `extra`, families of this process the workers record too) to this
        process's, their labels capped as its own; a flow-control series
        is noted as its flow's, as this process's own are."""
        caps = {"model_name": self.model, "target_model_name": self.model}
        return Merge(
            [*self.shipped_families(), *extra],
            {**caps, "fairness_id": self.fairness_id},
            self._merged,
        )

    def _merged(self, family: Family, labels: tuple[str, ...]) -> None:
        if family is self.queue_duration and labels[0] != OTHER:
            self._flow_series[FlowKey(labels[0], int(labels[1]))].add((family, labels))

    def shipped_families(self) -> list[Family]:
        """What a protocol worker records and ships: `stream_families`, and
        the families of `record_outcome` (from each DECISION's fields)."""
        return [
            *self.stream_families(),
            self.request_total, self.request_size, self.processing, self.queue_duration,
            self.flow_control_total, self.attempts, self.prefix_predicted,
            self.prefix_prompt, self.prefix_hit_bytes, self.prefix_hit_ratio,
        ]  # fmt: skip

    def stream_families(self) -> list[Family]:
        """The families written from what a stream sees (its response, its
        errors, while it runs), which a protocol worker records and ships."""
        return [
            self.request_errors, self.request_duration, self.response_size,
            self.input_tokens, self.output_tokens, self.cached_tokens, self.ntpot,
            self.ttft, self.streaming_tpot, self.streaming_itl, self.running,
            self.response_processing,
        ]  # fmt: skip

    def on_flows_collected(self, keys: Iterable[FlowKey]) -> None:
        """Remove the flow-control series of flows the core collected (the
        `other` series is shared, so it stays)."""
        for key in keys:
            for family, labels in self._flow_series.pop(key, ()):
                if labels[0] != OTHER:
                    family.remove(labels)
