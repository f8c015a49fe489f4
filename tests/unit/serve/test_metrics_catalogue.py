"""The metric catalogue: each metric declared once, the page writes exactly
the catalogued families with their labels, and the docs' table is the
catalogue's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from epp.cli import docgen
from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.kvevents import KVEventStats
from epp.datalayer.store import EndpointStore
from epp.extproc.events import Rejected, Release
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.cache_scorers import APPROX_PRODUCER, PrefixCacheScorer
from epp.scheduling.endpoint import EndpointMetrics
from epp.scheduling.kvblocks import KVBlockIndex
from epp.scheduling.request import InferenceRequest, PrefixMatch
from epp.scheduling.sessions import SessionBindings
from epp.scheduling.spec import PluginSpec
from epp.serve.decider import Decider
from epp.serve.metrics import EppMetrics, StageView
from epp.serve.metrics.catalogue import CATALOGUE, SPECS, markdown_table
from epp.serve.metrics.spec import Kind, Spec, Twin
from epp.serve.owner import Owner
from epp.serve.replica import ReplicaAdmission
from epp.serve.tokenizer import TokenizerStats
from tests.support.metrics_page import MetricsPage

APPROX = (APPROX_PRODUCER, APPROX_PRODUCER)


def fed_metrics() -> EppMetrics:
    """Metrics with every hook called and every scrape-time source watched."""
    metrics = EppMetrics("pool", clock=lambda: 3.0, endpoint_names=lambda address: ("a", "ns"))
    metrics.watch_scheduling(PluginSpec("pd", lambda: None, (), "pd-profile-handler"))
    for outcome in Outcome:
        request = FlowRequest(
            outcome.name, "tenant", 3, arrival=1.0, byte_size=10,
            payload=InferenceRequest("m", "t", prefix_match=PrefixMatch(*APPROX, 2, 4, 16, 70)),
        )  # fmt: skip
        metrics.on_queued(request)
        request.outcome = outcome
        request.endpoint = "10.0.0.1:8000" if outcome.is_dispatched else None
        metrics.on_outcome(request, 2.0)
        if outcome is Outcome.DISPATCHED:
            metrics.on_stream_event(
                Release(
                    request, Usage(10, 20, cached_tokens=4), 500, first_byte_at=1.5, streaming=True
                )
            )
            metrics.chunk_gaps(request).add(0.01)
    metrics.on_stream_event(Rejected(400, "bad-request", None))
    metrics.on_response_processed(0.001)
    metrics.plugin_durations.timed("Scorer", "queue-scorer", "q", lambda: 1)()
    metrics.watch_core(
        lambda: 0.5,
        StageView(lambda: {"decode": 0.4}, lambda: ("saturation-filter", 1), lambda: {"decode": 1}),
    )
    metrics.watch_limits(  # type: ignore[arg-type]
        SimpleNamespace(adjustments=lambda: {"e": 1}, limit_of=lambda _: 4, headroom_of=lambda _: 1)
    )
    metrics.watch_credits(lambda: {"decode": 1})
    store = EndpointStore([EndpointSpec("a", "10.0.0.1:8000")])
    store.set_metrics("10.0.0.1:8000", EndpointMetrics(waiting=1, updated_at=9.0))
    metrics.watch_pool(store.snapshot, staleness=2.0, clock=lambda: 10.0)
    metrics.watch_scrapes(lambda: {"timeout": 1, "unreadable": 1})
    metrics.watch_transport(  # type: ignore[arg-type]
        {"grpc": SimpleNamespace(open_connections=1, trips={"streams": 1})}
    )
    metrics.watch_sessions(lambda: {"s": SessionBindings(10, 5, clock=lambda: 1.0)})
    events = KVEventStats()
    events.messages["10.0.0.1:8000"] += 1
    events.errors["10.0.0.1:8000", "recv"] += 1
    events.events["BlockStored"] += 1
    events.dropped["malformed"] += 1
    events.replays["complete"] += 1
    index = KVBlockIndex(size=10)
    metrics.watch_kv_cache(lambda: index, events)
    index.matches([1])
    metrics.watch_prefix_index(lambda: [PrefixCacheScorer(64, 4, 10)])
    metrics.watch_token_producer(TokenizerStats())
    metrics.watch_workers(lambda: iter([("0", 3, 1, 0)]))
    metrics.watch_replicas(ReplicaAdmission("r", "127.0.0.1:1", 3, list, lambda _: None).stats)
    owner = Owner(0, lambda *_: None, lambda _: 0)  # type: ignore[arg-type,return-value]
    metrics.watch_replicas(Decider(owner, lambda _: 0, 3, lambda _: None, list).stats)
    return metrics


def exposed(metrics: EppMetrics) -> dict[str, tuple[str, set[frozenset[str]]]]:
    """Family name (as exposed) -> (type, the label-name sets of its series)."""
    page = MetricsPage.parse(metrics.exposition())

    def exposed_name(family: str, kind: str) -> str:
        return family + "_total" if kind == "counter" else family

    found = {exposed_name(name, kind): (kind, set()) for name, kind in page.families.items()}
    for sample in page.samples:
        found[exposed_name(sample.family, sample.kind)][1].add(frozenset(sample.labels) - {"le"})
    return found


def catalogued() -> dict[str, tuple[str, frozenset[str]]]:
    names = {}
    for entry in CATALOGUE:
        names[entry.name] = (entry.kind.value, frozenset(entry.labels))
        if entry.twin is not None:
            names[entry.twin.name] = (entry.kind.value, frozenset(entry.twin_labels))
    return names


def test_the_page_writes_every_catalogued_family_and_no_other():
    assert set(exposed(fed_metrics())) == set(catalogued())


def test_each_exposed_series_has_its_catalogued_type_and_labels():
    expected = catalogued()
    for name, (kind, label_sets) in exposed(fed_metrics()).items():
        assert kind == expected[name][0], name
        assert label_sets <= {expected[name][1]}, name


def test_the_docs_metric_table_is_the_catalogue():
    assert docgen.current("metrics") is not None, "docs/operations/metrics.md lost its table"
    assert docgen.current("metrics") == markdown_table(), (
        "the metric table is stale: run python3 -m epp.cli.docgen metrics"
    )


def test_a_metric_is_catalogued_once_with_its_twin_named_once():
    twins = [entry.twin.name for entry in CATALOGUE if entry.twin is not None]
    assert len(SPECS) == len(CATALOGUE)
    assert len(set(twins)) == len(twins)
    assert not set(twins) & set(SPECS)


def test_a_twin_keeps_only_labels_its_metric_has():
    with pytest.raises(ValueError, match="twin labels"):
        Spec("x_total", Kind.COUNTER, "x", ("a",), twin=Twin("y_total", ("b",)))


def test_a_counter_is_named_with_total_and_only_a_counter():
    with pytest.raises(ValueError, match="_total"):
        Spec("x", Kind.COUNTER, "x")
    with pytest.raises(ValueError, match="_total"):
        Spec("x_total", Kind.GAUGE, "x")


def test_buckets_go_with_histograms_only():
    with pytest.raises(ValueError, match="buckets"):
        Spec("x", Kind.HISTOGRAM, "x")
    with pytest.raises(ValueError, match="buckets"):
        Spec("x", Kind.GAUGE, "x", buckets=(1.0,))


def test_a_twin_sums_the_series_that_share_its_labels():
    metrics = EppMetrics("pool")
    for fairness_id in ("a", "b"):
        request = FlowRequest(
            fairness_id, fairness_id, 1, arrival=0.0, byte_size=1,
            payload=InferenceRequest("m", "t"),
        )  # fmt: skip
        request.outcome = Outcome.REJECTED_SATURATED
        metrics.on_outcome(request, 0.0)
    twin = {"model_name": "m", "target_model_name": "t", "priority": "1"}
    assert metrics.registry.get_sample_value("inference_objective_request_total", twin) == 2
