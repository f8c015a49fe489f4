"""The demo's watch of what the EPP saw of the servers' load."""

from __future__ import annotations

from epp.demo.loadwatch import PodSample, epp_view, render, summarize

EPP_PAGE = """\
llm_d_epp_per_endpoint_queue_size{model_server_endpoint="a",name="p"} 3.0
inference_pool_per_pod_queue_size{model_server_pod="a",name="p"} 3.0
epp_per_endpoint_kv_cache_utilization{model_server_endpoint="a",name="p"} 0.25
epp_per_endpoint_metrics_age_seconds{model_server_endpoint="a",name="p"} 0.02
llm_d_epp_ready_endpoints{name="p"} 1.0
"""


def sample(
    age: float, server_waiting: float = 2, epp_waiting: float = 2, read_s: float = 0.02
) -> PodSample:
    return PodSample(0.0, "a", server_waiting, 0.3, epp_waiting, 0.3, age, read_s)


def test_the_epps_per_pod_view_is_read_from_its_metrics():
    assert epp_view(EPP_PAGE) == {"a": {"waiting": 3.0, "kv_usage": 0.25, "age_s": 0.02}}


def test_a_view_at_most_the_interval_plus_a_slow_read_is_within_one_interval():
    summary = summarize([sample(0.01), sample(0.14, read_s=0.09)], scrape_interval_s=0.05)
    assert summary["seen_within_one_interval"]
    assert summary["slack_s"] == 0.09


def test_a_read_is_taken_to_need_at_least_the_floor():
    summary = summarize([sample(0.01), sample(0.1, read_s=0.002)], scrape_interval_s=0.05)
    assert summary["slack_s"] == 0.05
    assert summary["seen_within_one_interval"]
    assert summary["saw_load"]
    assert summary["pods"]["a"]["epp_peak_queue"] == 2


def test_one_stall_in_a_healthy_run_is_shown_as_the_maximum_and_does_not_fail_it():
    samples = [sample(0.01 + 0.05 * i / 199) for i in range(199)] + [sample(0.2)]
    summary = summarize(samples, scrape_interval_s=0.05)
    assert summary["seen_within_one_interval"]
    assert summary["view_age_max_s"] == 0.2
    assert "-> within one interval" in render(summary, "vllm")[0]


def test_a_view_often_older_than_the_interval_plus_a_read_is_not_within_one_interval():
    samples = [sample(0.01)] * 90 + [sample(0.2)] * 10
    summary = summarize(samples, scrape_interval_s=0.05)
    assert not summary["seen_within_one_interval"]
    assert "NOT within" in render(summary, "sglang")[0]


def test_queue_agreement_counts_samples_within_one_request():
    samples = [sample(0.01, 2, 3), sample(0.01, 2, 5)]
    assert summarize(samples, 0.05)["queue_within_one_request"] == 0.5


def test_no_samples_says_so():
    assert summarize([], 0.05) == {"samples": 0}
    assert "no samples" in render({"samples": 0}, "vllm")[0]
