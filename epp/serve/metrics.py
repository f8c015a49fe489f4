"""Prometheus metrics with the reference EPP's names and labels, served on :9090.

Per request (cheap: label children are cached per label tuple):
- `inference_objective_request_total{model_name,target_model_name,priority}`:
  every request that reached flow control;
- `inference_objective_request_error_total{model_name,target_model_name,error_code}`:
  every request answered with an error (the code is the dropped reason, or
  `bad-request`, `request-too-large`...; model names are empty when the body
  was never parsed);
- `inference_objective_request_duration_seconds`, `_input_tokens`,
  `_output_tokens` at the end of a dispatched request;
  `inference_objective_running_requests{model_name}` while it runs;
- `inference_extension_flow_control_request_queue_duration_seconds{fairness_id,
  priority,outcome,inference_pool,model_name,target_model_name}` when its
  stay in flow control ends.

At scrape time, read from the flow-control core (nothing per request):
`inference_extension_flow_control_queue_size` and `_queue_bytes` per flow
(`fairness_id, priority, inference_pool, model_name, target_model_name`; the
core keeps flows per fairness id and priority, not per model, so the model
labels are empty), and `inference_extension_flow_control_pool_saturation`.

`fairness_id` takes at most `fairness_id_limit` distinct values (default
1000); later ones are reported as `other`. When the core collects an idle
flow its queue-duration series are removed and its fairness id slot freed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from http import HTTPStatus

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from epp.extproc.events import Rejected, Release
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.request import InferenceRequest

OTHER = "other"
DEFAULT_FAIRNESS_ID_LIMIT = 1000

DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
    15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)

M = ("model_name", "target_model_name")
FLOW_LABELS = ("fairness_id", "priority", "inference_pool", *M)


def _models(request: FlowRequest | None) -> tuple[str, str]:
    payload = request.payload if request is not None else None
    if isinstance(payload, InferenceRequest):
        return payload.model, payload.target_model
    return "", ""


class FairnessIds:
    """Caps the distinct `fairness_id` label values; the rest are `other`.

    A value holds its slot while a flow (fairness id, priority) that used it
    is alive; `release` is called when the core collects such a flow.
    """

    __slots__ = ("_flows", "limit")

    def __init__(self, limit: int = DEFAULT_FAIRNESS_ID_LIMIT) -> None:
        self.limit = limit
        self._flows: dict[str, set[int]] = {}

    def label(self, fairness_id: str, priority: int) -> str:
        flows = self._flows.get(fairness_id)
        if flows is None:
            if len(self._flows) >= self.limit:
                return OTHER
            flows = self._flows[fairness_id] = set()
        flows.add(priority)
        return fairness_id

    def peek(self, fairness_id: str) -> str:
        """The label for `fairness_id` without taking a slot."""
        return fairness_id if fairness_id in self._flows else OTHER

    def release(self, key: FlowKey) -> None:
        flows = self._flows.get(key.fairness_id)
        if flows is None:
            return
        flows.discard(key.priority)
        if not flows:
            del self._flows[key.fairness_id]


class EppMetrics:
    """The EPP's metrics; see the module docstring. `on_outcome` and
    `on_flows_collected` plug into the AdmissionController, `on_stream_event`
    into the ext_proc servicer, `watch_core` adds the scrape-time gauges."""

    def __init__(
        self,
        pool_name: str,
        fairness_id_limit: int = DEFAULT_FAIRNESS_ID_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool_name = pool_name
        self.registry = CollectorRegistry()
        self.fairness_ids = FairnessIds(fairness_id_limit)
        self._clock = clock
        r = self.registry
        self.request_total = Counter(
            "inference_objective_request_total",
            "Requests that reached flow control, by objective priority.",
            [*M, "priority"],
            registry=r,
        )
        self.request_errors = Counter(
            "inference_objective_request_error_total",
            "Requests answered with an error.",
            [*M, "error_code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "inference_objective_request_duration_seconds",
            "From the end of the request body to the end of the response.",
            M,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.input_tokens = Histogram(
            "inference_objective_input_tokens",
            "Prompt tokens the model server reported.",
            M,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.output_tokens = Histogram(
            "inference_objective_output_tokens",
            "Completion tokens the model server reported.",
            M,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "inference_objective_running_requests",
            "Requests dispatched and not finished.",
            ["model_name"],
            registry=r,
        )
        self.queue_duration = Histogram(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time a request spent in flow control, by how it left.",
            [*FLOW_LABELS[:2], "outcome", *FLOW_LABELS[2:]],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self._children: dict[tuple, object] = {}
        self._flow_series: defaultdict[FlowKey, set[tuple[str, ...]]] = defaultdict(set)

    def _child(self, metric, labels: tuple[str, ...]):
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- hooks -------------------------------------------------------------------

    def on_outcome(self, request: FlowRequest, now: float) -> None:
        outcome = request.outcome
        if outcome is None:
            return
        model, target = _models(request)
        priority = str(request.priority)
        self._child(self.request_total, (model, target, priority)).inc()
        labels = (
            self.fairness_ids.label(request.fairness_id, request.priority),
            priority,
            outcome.reason,
            self.pool_name,
            model,
            target,
        )
        self._child(self.queue_duration, labels).observe(max(0.0, now - request.arrival))
        self._flow_series[FlowKey(request.fairness_id, request.priority)].add(labels)
        if outcome.is_dispatched:
            self._child(self.running, (model,)).inc()

    def on_stream_event(self, event: Rejected | Release) -> None:
        model, target = _models(event.request)
        if isinstance(event, Rejected):
            self._child(self.request_errors, (model, target, event.reason)).inc()
            return
        request = event.request
        self._child(self.request_duration, (model, target)).observe(
            max(0.0, self._clock() - request.arrival)
        )
        if event.input_tokens is not None:
            self._child(self.input_tokens, (model, target)).observe(event.input_tokens)
            self._child(self.output_tokens, (model, target)).observe(event.output_tokens)

    def on_complete(self, request: FlowRequest) -> None:
        """A dispatched request gave its endpoint back (however it ended)."""
        model, _ = _models(request)
        self._child(self.running, (model,)).dec()

    def on_flows_collected(self, keys: Iterable[FlowKey]) -> None:
        for key in keys:
            for labels in self._flow_series.pop(key, ()):
                if labels[0] == OTHER:
                    continue
                self._children.pop((id(self.queue_duration), labels), None)
                self.queue_duration.remove(*labels)
            self.fairness_ids.release(key)

    def watch_core(self, core: FlowController, saturation: Callable[[], float]) -> None:
        """Report the core's queues and the pool's saturation at scrape time."""
        self.registry.register(_FlowControlCollector(self, core, saturation))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _FlowControlCollector(Collector):
    def __init__(
        self, metrics: EppMetrics, core: FlowController, saturation: Callable[[], float]
    ) -> None:
        self._metrics = metrics
        self._core = core
        self._saturation = saturation

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "inference_extension_flow_control_queue_size",
            "Requests queued in flow control, per flow.",
            labels=FLOW_LABELS,
        )
        size_bytes = GaugeMetricFamily(
            "inference_extension_flow_control_queue_bytes",
            "Bytes of the requests queued in flow control, per flow.",
            labels=FLOW_LABELS,
        )
        pool = self._metrics.pool_name
        label_of = self._metrics.fairness_ids.peek
        totals: dict[tuple[str, str], list[int]] = {}
        for band in self._core.bands():
            priority = str(band.priority)
            for fairness_id, flow in band.flows.items():
                entry = totals.setdefault((label_of(fairness_id), priority), [0, 0])
                entry[0] += flow.count
                entry[1] += flow.bytes
        for (fairness_id, priority), (count, nbytes) in totals.items():
            labels = [fairness_id, priority, pool, "", ""]
            size.add_metric(labels, count)
            size_bytes.add_metric(labels, nbytes)
        saturation = GaugeMetricFamily(
            "inference_extension_flow_control_pool_saturation",
            "The pool's saturation as the gate sees it (1.0 and above: saturated).",
            labels=["inference_pool"],
        )
        saturation.add_metric([pool], self._saturation())
        yield size
        yield size_bytes
        yield saturation


Authorize = Callable[[str | None, str], Awaitable[int]]
"""(Authorization header, path) -> HTTP status: 200 lets the scrape through
(`epp.k8s.metrics_auth.MetricsAuthorizer.check` is one)."""


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
