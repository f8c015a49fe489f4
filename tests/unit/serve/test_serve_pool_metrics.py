"""What only this EPP reports of the pool, read from the endpoint store at scrape time."""

from __future__ import annotations

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.store import EndpointStore
from epp.scheduling.endpoint import EndpointMetrics
from epp.serve.metrics import EppMetrics
from tests.support.metrics_page import MetricsPage


def gauges(metrics: EppMetrics) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("model_server_endpoint", "")): sample.value
        for sample in MetricsPage.parse(metrics.exposition()).samples
        if sample.name.startswith("epp_per_endpoint_")
    }


def test_each_endpoints_kv_use_running_and_view_age_are_shown_after_a_good_read():
    store = EndpointStore(
        [EndpointSpec(name, f"10.0.0.{i}:8000") for i, name in enumerate("abc", 1)]
    )
    store.set_metrics("10.0.0.1:8000", EndpointMetrics(running=2, kv_usage=0.5, updated_at=9.0))
    store.set_metrics("10.0.0.2:8000", EndpointMetrics(waiting=9, updated_at=5.0))
    store.mark_failing("10.0.0.2:8000")
    metrics = EppMetrics("pool")
    metrics.watch_pool(store.snapshot, staleness=2.0, clock=lambda: 10.0)
    found = gauges(metrics)
    assert found[("epp_per_endpoint_kv_cache_utilization", "a")] == 0.5
    assert found[("epp_per_endpoint_running_requests", "a")] == 2
    assert found[("epp_per_endpoint_metrics_age_seconds", "a")] == 1.0
    assert not {pod for _, pod in found} - {"a"}


def test_scrape_failures_are_counted_by_reason():
    metrics = EppMetrics("pool")
    metrics.watch_scrapes(lambda: {"timeout": 2, "too-large": 1})
    page = MetricsPage.parse(metrics.exposition())
    found = page.by_label("reason", "epp_model_server_scrape_failures_total")
    assert found == {"timeout": 2, "too-large": 1}
