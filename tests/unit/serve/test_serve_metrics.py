"""The EPP's Prometheus metrics: the reference's `llm_d_epp_*` names and
labels with their deprecated twins, label caps, queue gauges with model
labels, the reference's outcome names, scheduler and pool gauges."""

from __future__ import annotations

import pytest

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.store import EndpointStore
from epp.extproc.events import Rejected, Release
from epp.flowcontrol.adaptive import AdaptiveGate
from epp.flowcontrol.flow import FlowKey
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.request import InferenceRequest
from epp.serve.metrics import (
    SCHEDULER_BUCKETS,
    EppMetrics,
    PluginDurations,
    Tally,
    TimedPlacer,
    flow_control_outcome,
)
from epp.serve.metrics.recorder import error_code

POOL = "pool"


def request(
    fairness_id: str = "tenant",
    model: str = "m",
    target: str = "t",
    priority: int = 3,
    byte_size: int = 100,
) -> FlowRequest:
    return FlowRequest(
        "r", fairness_id, priority, arrival=1.0, byte_size=byte_size,
        payload=InferenceRequest(model, target),
    )  # fmt: skip


def ended(flow_request: FlowRequest, outcome: Outcome, endpoint: str | None = None):
    flow_request.outcome = outcome
    flow_request.endpoint = endpoint
    return flow_request


def value(metrics: EppMetrics, sample_name: str, /, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(sample_name, labels)


def label_values(metrics: EppMetrics, sample_name: str, label: str) -> set[str]:
    return {
        sample.labels[label]
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == sample_name
    }


M = {"model_name": "m", "target_model_name": "t"}
R = {**M, "fairness_id": "tenant", "priority": "3"}


@pytest.fixture
def metrics() -> EppMetrics:
    return EppMetrics(POOL, clock=lambda: 3.0, endpoint_names=lambda address: ("pod-a", "ns"))


def test_a_dispatched_request_is_counted_under_both_names(metrics):
    metrics.on_outcome(ended(request(), Outcome.DISPATCHED, "10.0.0.1:8000"), 2.0)
    assert value(metrics, "llm_d_epp_request_total", **R) == 1
    assert value(metrics, "inference_objective_request_total", **M, priority="3") == 1
    assert value(metrics, "llm_d_epp_request_size_bytes_sum", **R) == 100
    assert value(metrics, "inference_objective_request_sizes_sum", **M) == 100
    assert value(metrics, "llm_d_epp_request_running", **R) == 1
    assert value(metrics, "inference_objective_running_requests", model_name="m") == 1
    assert value(metrics, "llm_d_epp_request_processing_duration_seconds_sum") == 1.0


def test_a_release_records_duration_tokens_and_ntpot_under_both_names(metrics):
    metrics.on_stream_event(Release(request(), Usage(10, 4)))
    for current, legacy in (
        ("llm_d_epp_request_duration_seconds_sum",
         "inference_objective_request_duration_seconds_sum"),
        ("llm_d_epp_request_input_tokens_sum", "inference_objective_input_tokens_sum"),
        ("llm_d_epp_request_output_tokens_sum", "inference_objective_output_tokens_sum"),
        ("llm_d_epp_request_ntpot_seconds_sum",
         "inference_objective_normalized_time_per_output_token_seconds_sum"),
    ):  # fmt: skip
        assert value(metrics, current, **R) == value(metrics, legacy, **M) > 0
    assert value(metrics, "llm_d_epp_request_ntpot_seconds_sum", **R) == 2.0 / 4


def test_a_streamed_release_records_size_ttft_and_tpot(metrics):
    release = Release(
        request(), Usage(10, 5), response_bytes=700, first_byte_at=1.5, streaming=True
    )
    metrics.on_stream_event(release)
    assert value(metrics, "llm_d_epp_response_size_bytes_sum", **R) == 700
    assert value(metrics, "inference_objective_response_sizes_sum", **M) == 700
    assert value(metrics, "llm_d_epp_request_ttft_seconds_sum", **R, streaming="true") == 0.5
    assert value(metrics, "llm_d_epp_request_streaming_tpot_seconds_sum", **R) == 1.5 / 4


def test_cached_prompt_tokens_are_recorded_under_both_names_when_reported(metrics):
    metrics.on_stream_event(Release(request(), Usage(10, 5, cached_tokens=8)))
    metrics.on_stream_event(Release(request(), Usage(10, 5)))
    assert value(metrics, "llm_d_epp_request_cached_tokens_count", **R) == 1
    assert value(metrics, "llm_d_epp_request_cached_tokens_sum", **R) == 8
    assert value(metrics, "inference_objective_prompt_cached_tokens_sum", **M) == 8


def test_chunk_gaps_go_to_the_requests_inter_token_latency(metrics):
    gaps = metrics.chunk_gaps(request())
    gaps.add(0.03)
    gaps.add(0.05)
    assert value(metrics, "llm_d_epp_request_streaming_itl_seconds_count", **R) == 2
    assert value(metrics, "llm_d_epp_request_streaming_itl_seconds_bucket", **R, le="0.04") == 1


def test_response_processing_is_one_observation_per_request(metrics):
    metrics.on_response_processed(0.0002)
    assert value(metrics, "llm_d_epp_response_processing_duration_seconds_count") == 1
    assert value(metrics, "llm_d_epp_response_processing_duration_seconds_sum") == 0.0002


def test_plugin_calls_are_timed_under_both_names():
    durations = PluginDurations()
    metrics = EppMetrics(POOL, plugin_durations=durations)
    score = durations.timed("Scorer", "queue-scorer", "q", lambda a, b: a + b)
    assert score(1, 2) == 3
    labels = {"extension_point": "Scorer", "plugin_type": "queue-scorer", "plugin_name": "q"}
    assert value(metrics, "llm_d_epp_plugin_duration_seconds_count", **labels) == 1
    assert value(metrics, "inference_extension_plugin_duration_seconds_count", **labels) == 1


def test_scrape_failures_are_the_references_poll_and_extract_errors_and_ours_by_reason(metrics):
    metrics.watch_scrapes(lambda: {"timeout": 2, "connection": 1, "unreadable": 4})
    source = {"source_type": "metrics-data-source"}
    extractor = {**source, "extractor_type": "core-metrics-extractor"}
    assert value(metrics, "llm_d_epp_datalayer_poll_errors_total", **source) == 3
    assert value(metrics, "llm_d_inference_scheduler_datalayer_poll_errors_total", **source) == 3
    assert value(metrics, "llm_d_epp_datalayer_extract_errors_total", **extractor) == 4
    assert value(
        metrics, "llm_d_inference_scheduler_datalayer_extract_errors_total", **extractor
    ) == 4  # fmt: skip
    assert value(metrics, "epp_model_server_scrape_failures_total", reason="timeout") == 2


def test_a_response_without_body_has_no_ttft(metrics):
    metrics.on_stream_event(Release(request(), Usage(10, 5)))
    assert value(metrics, "llm_d_epp_request_ttft_seconds_count", **R, streaming="false") is None
    assert value(metrics, "llm_d_epp_response_size_bytes_count", **R) is None


def test_running_requests_go_down_at_completion(metrics):
    flow_request = ended(request(), Outcome.DISPATCHED, "10.0.0.1:8000")
    metrics.on_outcome(flow_request, 2.0)
    metrics.on_complete(flow_request)
    assert value(metrics, "llm_d_epp_request_running", **R) == 0
    assert value(metrics, "inference_objective_running_requests", model_name="m") == 0


def test_errors_are_counted_with_the_references_code_under_both_names(metrics):
    metrics.on_stream_event(
        Rejected(429, "rejected-saturated", ended(request(), Outcome.REJECTED_SATURATED))
    )
    assert value(metrics, "llm_d_epp_request_error_total", **R, error_code="ResourceExhausted")
    assert value(
        metrics, "inference_objective_request_error_total", **M, error_code="ResourceExhausted"
    )


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "BadRequest"),
        (413, "BadRequest"),
        (431, "BadRequest"),
        (429, "ResourceExhausted"),
        (500, "Internal"),
        (503, "ServiceUnavailable"),
    ],
)
def test_an_answered_error_reads_the_references_code_for_its_status(status, code):
    assert error_code(status) == code


def test_an_error_before_parsing_has_empty_labels(metrics):
    metrics.on_stream_event(Rejected(400, "bad-request", None))
    labels = {"model_name": "", "target_model_name": "", "fairness_id": "", "priority": ""}
    assert value(metrics, "llm_d_epp_request_error_total", **labels, error_code="BadRequest")


def test_a_model_servers_non_2xx_answer_is_a_model_server_error(metrics):
    dispatched = ended(request(), Outcome.DISPATCHED, "10.0.0.1:8000")
    metrics.on_stream_event(Release(dispatched, None, upstream_status=404))
    assert value(metrics, "llm_d_epp_request_error_total", **R, error_code="ModelServerError")
    assert value(metrics, "llm_d_epp_request_duration_seconds_count", **R) == 1


def test_a_model_servers_2xx_answer_is_no_error(metrics):
    dispatched = ended(request(), Outcome.DISPATCHED, "10.0.0.1:8000")
    metrics.on_stream_event(Release(dispatched, Usage(1, 1), upstream_status=201))
    metrics.on_stream_event(Release(dispatched, Usage(1, 1)))
    assert label_values(metrics, "llm_d_epp_request_error_total", "error_code") == set()


def test_an_enqueue_is_timed_by_the_outcome_its_call_left_it_with(metrics):
    metrics.on_enqueued(ended(request(), Outcome.DISPATCHED), 0.0003)
    metrics.on_enqueued(ended(request(), Outcome.REJECTED_SATURATED), 0.0001)
    metrics.on_enqueued(request(), 0.002)
    flow = {"fairness_id": "tenant", "priority": "3"}
    for outcome in ("Dispatched", "RejectedCapacity", "NotYetFinalized"):
        name = "llm_d_epp_flow_control_request_enqueue_duration_seconds_count"
        assert value(metrics, name, **flow, outcome=outcome) == 1
        twin = "inference_extension_flow_control_request_enqueue_duration_seconds_count"
        assert value(metrics, twin, **flow, outcome=outcome) == 1


def test_a_dispatch_cycle_is_tallied_once_per_call(metrics):
    for seconds in (0.00005, 0.0004, 0.03):
        metrics.on_dispatch_cycle(seconds)
    name = "llm_d_epp_flow_control_dispatch_cycle_duration_seconds"
    assert value(metrics, name + "_count") == 3
    assert value(metrics, name + "_bucket", le="0.0005") == 2
    twin = "inference_extension_flow_control_dispatch_cycle_duration_seconds_count"
    assert value(metrics, twin) == 3


def test_a_collected_flow_loses_its_enqueue_series(metrics):
    metrics.on_enqueued(request(), 0.001)
    metrics.on_flows_collected([FlowKey("tenant", 3)])
    name = "llm_d_epp_flow_control_request_enqueue_duration_seconds_count"
    assert label_values(metrics, name, "fairness_id") == set()


def test_queued_requests_carry_model_labels_and_leave_the_gauges(metrics):
    flow = {"fairness_id": "tenant", "priority": "3", "inference_pool": POOL, **M}
    first, second = request(byte_size=100), request(byte_size=50)
    metrics.on_queued(first)
    metrics.on_queued(second)
    for name in (
        "llm_d_epp_flow_control_queue_size",
        "inference_extension_flow_control_queue_size",
    ):
        assert value(metrics, name, **flow) == 2
    assert value(metrics, "llm_d_epp_flow_control_queue_bytes", **flow) == 150
    metrics.on_outcome(ended(first, Outcome.DISPATCHED, "10.0.0.1:8000"), 2.0)
    assert value(metrics, "llm_d_epp_flow_control_queue_size", **flow) == 1
    assert value(metrics, "inference_extension_flow_control_queue_bytes", **flow) == 50


def test_flow_control_outcomes_read_the_references_names(metrics):
    metrics.on_queued(waiting := request())
    metrics.on_outcome(ended(waiting, Outcome.REJECTED_TTL_EXPIRED), 2.0)
    metrics.on_outcome(ended(request(), Outcome.REJECTED_SATURATED), 2.0)
    total = "llm_d_epp_flow_control_requests_total"
    assert value(metrics, total, outcome="EvictedTTL", priority="3", inference_pool=POOL) == 1
    assert value(metrics, total, outcome="RejectedCapacity", priority="3", inference_pool=POOL)
    duration = "inference_extension_flow_control_request_queue_duration_seconds_count"
    assert value(
        metrics, duration, fairness_id="tenant", priority="3", outcome="EvictedTTL",
        inference_pool=POOL, **M,
    ) == 1  # fmt: skip


@pytest.mark.parametrize(
    ("outcome", "queued", "name"),
    [
        (Outcome.DISPATCHED, True, "Dispatched"),
        (Outcome.REJECTED_FILTERED, True, "Dispatched"),
        (Outcome.REJECTED_SATURATED, False, "RejectedCapacity"),
        (Outcome.REJECTED_SATURATED, True, "EvictedOther"),
        (Outcome.REJECTED_NO_ENDPOINTS, False, "RejectedNoEndpoints"),
        (Outcome.REJECTED_NO_ENDPOINTS, True, "EvictedNoEndpoints"),
        (Outcome.REJECTED_TTL_EXPIRED, True, "EvictedTTL"),
        (Outcome.CANCELLED, True, "EvictedContextCancelled"),
        (Outcome.CANCELLED, False, "RejectedOther"),
        (Outcome.REJECTED_SHUTTING_DOWN, False, "RejectedOther"),
        (Outcome.REJECTED_SHUTTING_DOWN, True, "EvictedOther"),
    ],
)
def test_every_outcome_has_a_reference_name(outcome, queued, name):
    assert flow_control_outcome(outcome, queued) == name


def test_fairness_ids_beyond_the_cap_read_other():
    metrics = EppMetrics(POOL, label_limit=2)
    for tenant in ("a", "b", "c", "d"):
        metrics.on_outcome(ended(request(tenant), Outcome.DISPATCHED), 2.0)
    assert label_values(metrics, "llm_d_epp_request_total", "fairness_id") == {"a", "b", "other"}


def test_model_names_share_one_cap():
    metrics = EppMetrics(POOL, label_limit=3)
    for model, target in (("a", "x"), ("b", "y")):
        metrics.on_outcome(ended(request(model=model, target=target), Outcome.DISPATCHED), 2.0)
    assert label_values(metrics, "llm_d_epp_request_total", "model_name") == {"a", "b"}
    assert label_values(metrics, "llm_d_epp_request_total", "target_model_name") == {"x", "other"}


def test_the_cap_holds_for_the_life_of_the_process():
    metrics = EppMetrics(POOL, label_limit=1)
    metrics.on_outcome(ended(request("a"), Outcome.DISPATCHED), 2.0)
    metrics.on_flows_collected([FlowKey("a", 3)])
    metrics.on_outcome(ended(request("b"), Outcome.DISPATCHED), 2.0)
    assert label_values(metrics, "llm_d_epp_request_total", "fairness_id") == {"a", "other"}


def test_a_collected_flow_loses_its_flow_control_series(metrics):
    metrics.on_queued(waiting := request())
    metrics.on_outcome(ended(waiting, Outcome.DISPATCHED), 2.0)
    metrics.on_flows_collected([FlowKey("tenant", 3)])
    for name in (
        "llm_d_epp_flow_control_request_queue_duration_seconds_count",
        "inference_extension_flow_control_request_queue_duration_seconds_count",
        "llm_d_epp_flow_control_queue_size",
        "inference_extension_flow_control_queue_bytes",
    ):
        assert label_values(metrics, name, "fairness_id") == set(), name
    assert value(metrics, "llm_d_epp_request_total", **R) == 1


def test_scheduler_attempts_name_the_endpoint(metrics):
    metrics.on_outcome(ended(request(), Outcome.DISPATCHED, "10.0.0.1:8000"), 2.0)
    metrics.on_outcome(ended(request(), Outcome.REJECTED_NO_ENDPOINTS), 2.0)
    assert value(
        metrics, "llm_d_epp_scheduler_attempts_total", status="success", target_model_name="t",
        endpoint_name="pod-a", namespace="ns", port="8000",
    ) == 1  # fmt: skip
    assert value(
        metrics, "inference_extension_scheduler_attempts_total", status="success",
        target_model_name="t", pod_name="pod-a", namespace="ns", port="8000",
    ) == 1  # fmt: skip
    assert value(
        metrics, "llm_d_epp_scheduler_attempts_total", status="failure", target_model_name="t",
        endpoint_name="", namespace="", port="",
    ) == 1  # fmt: skip


class FixedPlacer:
    def place(self, flow_request):
        return "10.0.0.1:8000"

    def has_endpoints(self) -> bool:
        return True


def test_every_scheduler_call_is_timed_under_both_names():
    tally = Tally(SCHEDULER_BUCKETS)
    metrics = EppMetrics(POOL, scheduler_latency=tally)
    placer = TimedPlacer(FixedPlacer(), tally)
    assert placer.place(request()) == "10.0.0.1:8000"
    assert placer.place(request()) == "10.0.0.1:8000"
    assert placer.has_endpoints()
    assert value(metrics, "llm_d_epp_scheduler_e2e_duration_seconds_count") == 2
    assert value(metrics, "inference_extension_scheduler_e2e_duration_seconds_count") == 2


def test_a_tally_counts_cumulatively():
    tally = Tally((0.1, 1.0))
    for seconds in (0.05, 0.5, 0.7, 5.0):
        tally.add(seconds)
    assert tally.cumulative() == [("0.1", 1), ("1.0", 3), ("+Inf", 4)]
    assert (tally.count, tally.total) == (4, 6.25)


def test_a_twin_sums_the_series_that_share_its_labels(metrics):
    for tenant in ("a", "b"):
        metrics.on_stream_event(Release(request(tenant), Usage(10, 4)))
    assert value(metrics, "inference_objective_input_tokens_count", **M) == 2
    assert value(metrics, "inference_objective_input_tokens_sum", **M) == 20
    assert value(metrics, "inference_objective_input_tokens_bucket", **M, le="8.0") == 0
    assert value(metrics, "inference_objective_input_tokens_bucket", **M, le="16.0") == 2


def test_pool_gauges_average_the_fresh_endpoints_under_both_names():
    store = EndpointStore([EndpointSpec(f"pod-{i}", f"10.0.0.{i}:8000") for i in (1, 2, 3)])
    store.set_metrics("10.0.0.1:8000", EndpointMetrics(2, 4, 0.2, updated_at=99.5))
    store.set_metrics("10.0.0.2:8000", EndpointMetrics(4, 8, 0.4, updated_at=99.0))
    store.set_metrics("10.0.0.3:8000", EndpointMetrics(50, 50, 0.9, updated_at=90.0))
    metrics = EppMetrics(POOL)
    metrics.watch_pool(store.snapshot, staleness=2.0, clock=lambda: 100.0)
    for current, legacy, expected in (
        ("llm_d_epp_ready_endpoints", "inference_pool_ready_pods", 2),
        ("llm_d_epp_average_queue_size", "inference_pool_average_queue_size", 3),
        ("llm_d_epp_average_running_requests", "inference_pool_average_running_requests", 6),
        ("llm_d_epp_average_kv_cache_utilization",
         "inference_pool_average_kv_cache_utilization", 0.3),
    ):  # fmt: skip
        assert value(metrics, current, name=POOL) == pytest.approx(expected)
        assert value(metrics, legacy, name=POOL) == pytest.approx(expected)
    assert value(metrics, "llm_d_epp_std_dev_queue_size", name=POOL) == pytest.approx(1.0)
    assert value(
        metrics, "llm_d_epp_per_endpoint_queue_size", name=POOL, model_server_endpoint="pod-3"
    ) == 50  # fmt: skip
    assert value(
        metrics, "inference_pool_per_pod_queue_size", name=POOL, model_server_pod="pod-3"
    ) == 50  # fmt: skip


def test_pool_saturation_is_the_effective_stage_under_both_names():
    metrics = EppMetrics(POOL)
    metrics.watch_core(lambda: 0.75)
    for name in (
        "llm_d_epp_flow_control_pool_saturation",
        "inference_extension_flow_control_pool_saturation",
    ):
        assert value(metrics, name, inference_pool=POOL, stage="effective") == 0.75


def test_the_build_is_reported():
    metrics = EppMetrics(POOL)
    assert label_values(metrics, "llm_d_epp_info", "build_ref") == {"epp"}
    assert label_values(metrics, "inference_extension_info", "build_ref") == {"epp"}


def test_the_learned_limits_headroom_and_adjustments_are_exported_per_endpoint():
    endpoint = "10.0.0.1:8000"
    pool = PoolSnapshot(
        (Endpoint("e", endpoint, metrics=EndpointMetrics(running=9, updated_at=1.0)),), 1, 1
    )
    gate = AdaptiveGate(lambda: pool, lambda: 1.0)
    for priority in (10, 0):
        gate.is_open(priority)
    gate.has_room(endpoint, 0)  # reads the snapshot: the limit grows to 9
    metrics = EppMetrics("pool")
    metrics.watch_limits(gate)
    samples = {
        sample.name: (sample.labels, sample.value)
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name.startswith("llm_d_epp_flow_control_endpoint")
    }
    labels = {"inference_pool": "pool", "endpoint": endpoint}
    assert samples == {
        "llm_d_epp_flow_control_endpoint_limit": (labels, 9.0),
        "llm_d_epp_flow_control_endpoint_headroom": (labels, 1.0),
        "llm_d_epp_flow_control_endpoint_limit_adjustments_total": (labels, 1.0),
    }
