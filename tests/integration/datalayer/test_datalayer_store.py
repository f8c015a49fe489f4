import pytest

from epp.datalayer.endpoints import (
    EndpointSpec,
    parse_endpoints_document,
    parse_static_endpoints,
    pod_endpoints,
)
from epp.datalayer.engines import ENGINE_LABEL
from epp.datalayer.store import EndpointStore
from epp.scheduling.endpoint import EndpointMetrics

A = EndpointSpec("a", "10.0.0.1:8000")
B = EndpointSpec("b", "10.0.0.2:8000")


def test_a_snapshot_is_reused_until_something_changes():
    store = EndpointStore([A])
    first = store.snapshot()
    assert store.snapshot() is first
    store.set_metrics(A.address, EndpointMetrics(waiting=1, updated_at=1.0))
    assert store.snapshot() is not first


def test_an_added_endpoint_joins_the_snapshot_and_tells_listeners():
    store = EndpointStore([A])
    calls = []
    store.on_membership_change(lambda: calls.append(1))
    before = store.snapshot().membership
    assert store.upsert(B)
    snapshot = store.snapshot()
    assert [endpoint.address for endpoint in snapshot.endpoints] == [A.address, B.address]
    assert snapshot.membership == before + 1
    assert calls == [1]


def test_upserting_an_unchanged_endpoint_changes_nothing():
    store = EndpointStore([A])
    version = store.snapshot().version
    assert not store.upsert(A)
    assert store.snapshot().version == version


def test_new_labels_keep_the_metrics_and_the_membership():
    store = EndpointStore([A])
    store.set_metrics(A.address, EndpointMetrics(waiting=2, updated_at=1.0))
    membership = store.snapshot().membership
    assert store.upsert(EndpointSpec("a", A.address, {ENGINE_LABEL: "sglang"}))
    endpoint = store.snapshot().endpoints[0]
    assert endpoint.labels == {ENGINE_LABEL: "sglang"}
    assert endpoint.metrics.waiting == 2
    assert store.snapshot().membership == membership


def test_a_removed_endpoint_leaves_the_snapshot():
    store = EndpointStore([A, B])
    assert store.remove(A.address)
    assert not store.remove(A.address)
    assert [endpoint.name for endpoint in store.snapshot().endpoints] == ["b"]


def test_replacing_all_keeps_the_metrics_of_endpoints_that_stay():
    store = EndpointStore([A, B])
    store.set_metrics(B.address, EndpointMetrics(running=3, updated_at=1.0))
    c = EndpointSpec("c", "10.0.0.3:8000")
    assert store.replace_all([B, c])
    assert store.addresses() == [B.address, c.address]
    assert store.get(B.address).metrics.running == 3
    assert not store.replace_all([B, c])


def test_metrics_for_an_unknown_address_are_ignored():
    store = EndpointStore([A])
    assert not store.set_metrics("10.9.9.9:1", EndpointMetrics(updated_at=1.0))
    assert len(store) == 1


def test_set_metrics_reports_whether_a_value_changed():
    store = EndpointStore([A])
    assert store.set_metrics(A.address, EndpointMetrics(waiting=1, updated_at=1.0))
    assert not store.set_metrics(A.address, EndpointMetrics(waiting=1, updated_at=2.0))
    assert store.set_metrics(A.address, EndpointMetrics(waiting=2, updated_at=3.0))


def test_new_metrics_make_a_new_endpoint_with_every_other_field_kept():
    store = EndpointStore([EndpointSpec("a", "10.0.0.1:8000", {"role": "decode"}, "ns/a")])
    before = store.snapshot().endpoints[0]
    metrics = EndpointMetrics(waiting=3, updated_at=2.0)
    store.set_metrics(before.address, metrics)
    after = store.snapshot().endpoints[0]
    assert after is not before
    assert after.metrics is metrics
    for name in before.__slots__:
        if name != "metrics":
            assert getattr(after, name) == getattr(before, name), name


def test_a_failing_endpoint_is_stale_at_once_and_keeps_its_values():
    store = EndpointStore([A])
    store.set_metrics(A.address, EndpointMetrics(waiting=4, updated_at=1.0))
    assert store.mark_failing(A.address)
    assert not store.mark_failing(A.address)
    metrics = store.get(A.address).metrics
    assert metrics.waiting == 4
    assert metrics.is_stale(now=1.0, staleness=10.0)


def test_a_recovered_endpoint_counts_as_changed():
    store = EndpointStore([A])
    store.set_metrics(A.address, EndpointMetrics(waiting=1, updated_at=1.0))
    store.mark_failing(A.address)
    assert store.set_metrics(A.address, EndpointMetrics(waiting=1, updated_at=2.0))


def test_a_static_list_gives_one_endpoint_per_address():
    specs = parse_static_endpoints(" 10.0.0.1:8000, [fd00::1]:9000 ,", {ENGINE_LABEL: "vllm"})
    assert [spec.address for spec in specs] == ["10.0.0.1:8000", "[fd00::1]:9000"]
    assert specs[0].labels == {ENGINE_LABEL: "vllm"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.2:80,host.example:80", "static endpoint 'host.example:80': 'host.example'"),
        ("10.0.0.1:80,10.0.0.1:80", "listed twice"),
        (" , ", "empty"),
    ],
)
def test_a_bad_static_list_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_static_endpoints(text)


def test_a_pod_gives_one_endpoint_per_target_port():
    specs = pod_endpoints("pod-1", "10.1.0.5", {"app": "vllm"}, [8000, 8001])
    assert [(spec.name, spec.address) for spec in specs] == [
        ("pod-1-8000", "10.1.0.5:8000"),
        ("pod-1-8001", "10.1.0.5:8001"),
    ]


def test_a_pod_with_one_port_keeps_its_name():
    assert pod_endpoints("pod-1", "10.1.0.5", {}, [8000])[0].name == "pod-1"


def test_a_pods_endpoints_have_the_reference_ids_namespace_pod_rank():
    specs = pod_endpoints("pod-1", "10.1.0.5", {}, [8000, 8001], namespace="llm")
    assert [spec.id for spec in specs] == ["llm/pod-1-rank-0", "llm/pod-1-rank-1"]
    store = EndpointStore(specs)
    assert [endpoint.id for endpoint in store.snapshot().endpoints] == [
        "llm/pod-1-rank-0",
        "llm/pod-1-rank-1",
    ]


ENDPOINTS_DOCUMENT = """
# the reference's file-discovery format
endpoints:
  - name: pod-a
    namespace: default
    address: 10.0.0.1
    port: "8000"
    labels:
      llm-d.ai/engine-type: sglang
  - name: pod-b
    address: fd00::2
    port: 9000
"""


def test_an_endpoints_document_gives_names_addresses_and_labels():
    specs = parse_endpoints_document(ENDPOINTS_DOCUMENT)
    assert [(s.name, s.address) for s in specs] == [
        ("pod-a", "10.0.0.1:8000"),
        ("pod-b", "[fd00::2]:9000"),
    ]
    assert specs[0].labels == {ENGINE_LABEL: "sglang"}
    assert specs[1].labels == {}


def test_an_endpoints_document_gives_the_reference_ids_namespace_default_by_default():
    specs = parse_endpoints_document(ENDPOINTS_DOCUMENT.replace("default", "team-a"))
    assert [s.id for s in specs] == ["team-a/pod-a", "default/pod-b"]


def test_an_endpoint_whose_id_changes_is_replaced_keeping_its_metrics():
    store = EndpointStore([EndpointSpec("a", "10.0.0.1:8000", id="ns/a")])
    store.set_metrics("10.0.0.1:8000", EndpointMetrics(waiting=3, updated_at=1.0))
    assert store.upsert(EndpointSpec("a", "10.0.0.1:8000", id="ns/a-rank-0"))
    endpoint = store.get("10.0.0.1:8000")
    assert (endpoint.id, endpoint.metrics.waiting) == ("ns/a-rank-0", 3)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{address: 10.0.0.1, port: 1}", "endpoints\\[0\\].name: required"),
        ("{name: a, address: host, port: 1}", "endpoints\\[0\\].address"),
        ("{name: a, address: 10.0.0.1, port: 70000}", "endpoints\\[0\\].port"),
        ("{name: a, address: 10.0.0.1, port: 1, labels: {a: 1}}", "endpoints\\[0\\].labels"),
    ],
)
def test_a_bad_endpoints_document_entry_is_named(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_endpoints_document(f"endpoints:\n  - {entry}\n")


def test_an_endpoint_listed_twice_in_a_document_is_an_error():
    entry = "  - {name: a, address: 10.0.0.1, port: 1}\n"
    with pytest.raises(ValueError, match="listed twice"):
        parse_endpoints_document("endpoints:\n" + entry + entry)
