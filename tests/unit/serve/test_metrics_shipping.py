"""A protocol worker's stream-side series, shipped to the core owner's page
(`epp.serve.metrics.shipping`): what the owner shows is what one process
recording every update would show, however the updates were split into
takes and workers; a dead worker's running requests leave the gauge."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from epp.flowcontrol.flow import FlowKey
from epp.serve.metrics.catalogue import P
from epp.serve.metrics.recorder import RequestMetrics
from epp.serve.metrics.series import OTHER
from epp.serve.metrics.shipping import take
from tests.support.series import shown

LABELS = [("m", "m", "a", "0"), ("m", "n", "b", "5"), ("", "", "", "")]
update = st.tuples(
    st.sampled_from(["duration", "running", "errors", "itl"]),
    st.sampled_from(range(len(LABELS))),
    st.floats(0.0, 100.0, allow_nan=False),
    st.integers(0, 2),  # the worker it happens on
    st.booleans(),  # a take after it
)


def apply(metrics: RequestMetrics, kind: str, labels: tuple[str, ...], value: float) -> None:
    if kind == "duration":
        metrics.request_duration.observe(labels, value)
    elif kind == "running":
        metrics.running.add(labels, 1.0 if value > 50 else -1.0)
    elif kind == "errors":
        metrics.request_errors.add((*labels, "BadRequest"))
    else:
        metrics.streaming_itl.observe(labels, value / 100)


def page(metrics: RequestMetrics) -> dict:
    return shown(metrics.stream_families())


def shipped(rows):
    """The rows as they cross the link."""
    return orjson.loads(orjson.dumps(rows))


@given(st.lists(update, max_size=60))
def test_the_owners_page_adds_up_to_one_process_however_the_updates_were_taken(updates):
    alone = RequestMetrics("pool")
    owner = RequestMetrics("pool")
    workers = [RequestMetrics("") for _ in range(3)]
    merge = owner.merge()
    for kind, labels, value, worker, then_take in updates:
        apply(alone, kind, LABELS[labels], value)
        apply(workers[worker], kind, LABELS[labels], value)
        if then_take:
            merge.add(worker, shipped(take(workers[worker].stream_families())))
    for index, worker in enumerate(workers):
        merge.add(index, shipped(take(worker.stream_families())))

    assert page(owner) == page(alone)


def test_a_take_starts_the_families_again_from_nothing():
    worker = RequestMetrics("")
    worker.request_duration.observe(LABELS[0], 0.5)

    assert take(worker.stream_families()) != []
    assert take(worker.stream_families()) == []


def test_a_gauge_series_back_at_zero_within_one_take_is_on_the_owners_page():
    owner = RequestMetrics("pool")
    worker = RequestMetrics("")
    worker.running.add(LABELS[0])
    worker.running.add(LABELS[0], -1)

    owner.merge().add(0, shipped(take(worker.stream_families())))

    assert owner.running.values == {LABELS[0]: 0.0}


def test_a_dead_workers_running_requests_leave_the_running_gauge():
    owner = RequestMetrics("pool")
    merge = owner.merge()
    first, second = RequestMetrics(""), RequestMetrics("")
    first.running.add(LABELS[0], 2)
    second.running.add(LABELS[0], 1)
    merge.add(0, shipped(take(first.stream_families())))
    merge.add(1, shipped(take(second.stream_families())))

    merge.forget(0)

    assert owner.running.values[LABELS[0]] == 1
    assert P + "request_running" in {family.spec.name for family in owner.stream_families()}


def test_shipped_client_chosen_labels_are_capped_as_the_owners_own():
    owner = RequestMetrics("pool", label_limit=1)
    merge = owner.merge()
    worker = RequestMetrics("")
    worker.request_duration.observe(("m", "m", "tenant-1", "0"), 1.0)
    worker.request_duration.observe(("m", "m", "tenant-2", "0"), 1.0)

    merge.add(0, shipped(take(worker.stream_families())))

    assert set(owner.request_duration.values) == {
        ("m", "m", "tenant-1", "0"),
        ("m", "m", OTHER, "0"),
    }


def test_a_collected_flows_queue_durations_shipped_by_a_worker_leave_the_owners_page():
    owner = RequestMetrics("pool")
    merge = owner.merge()
    worker = RequestMetrics("pool")
    worker.flows_here = False
    flow = ("tenant", "5", "Dispatched", "pool", "m", "m")
    other_flow = ("tenant", "0", "Dispatched", "pool", "m", "m")
    worker.queue_duration.observe(flow, 0.25)
    worker.queue_duration.observe(other_flow, 0.5)
    merge.add(0, shipped(take(worker.shipped_families())))

    owner.on_flows_collected([FlowKey("tenant", 5)])

    assert set(owner.queue_duration.values) == {other_flow}
