"""Pods as endpoints: which pods serve, and how the sink follows them."""

from __future__ import annotations

from epp.api.models import InferencePool
from epp.datalayer.store import EndpointStore
from epp.k8s.pods import PodEndpoints, endpoints_of, is_serving, label_selector
from tests.support.kube import pod

POOL = InferencePool("pool-a", selector={"app": "a", "tier": "gpu"}, target_ports=(8000,))


def test_a_ready_pod_with_an_ip_serves():
    assert is_serving(pod("p", "10.0.0.1"))


def test_an_unready_pod_does_not_serve():
    assert not is_serving(pod("p", "10.0.0.1", ready=False))


def test_a_terminating_ready_pod_does_not_serve():
    assert not is_serving(pod("p", "10.0.0.1", deleting=True))


def test_a_pod_without_an_ip_does_not_serve():
    assert not is_serving(pod("p", ""))


def test_a_pod_without_conditions_does_not_serve():
    unscheduled = pod("p", "10.0.0.1")
    del unscheduled["status"]["conditions"]
    assert not is_serving(unscheduled)


def test_a_pod_gives_one_endpoint_per_target_port_with_its_labels():
    pool = InferencePool("pool-a", target_ports=(8000, 8001))
    specs = endpoints_of(pod("p", "10.0.0.1", {"app": "a"}), pool)
    assert [(s.name, s.address, dict(s.labels)) for s in specs] == [
        ("p-8000", "10.0.0.1:8000", {"app": "a"}),
        ("p-8001", "10.0.0.1:8001", {"app": "a"}),
    ]


def test_an_ipv6_pod_address_is_bracketed():
    [spec] = endpoints_of(pod("p", "fd00::1"), POOL)
    assert spec.address == "[fd00::1]:8000"


def test_the_label_selector_is_in_query_syntax_and_sorted():
    assert label_selector(POOL) == "app=a,tier=gpu"


def test_tracked_pods_follow_updates_deletes_and_relists():
    store = EndpointStore()
    pods = PodEndpoints(store, POOL)
    pods.replace([pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2", ready=False)])
    assert store.addresses() == ["10.0.0.1:8000"]
    pods.event("MODIFIED", pod("p2", "10.0.0.2"))
    pods.event("MODIFIED", pod("p1", "10.0.0.9"))
    assert sorted(store.addresses()) == ["10.0.0.2:8000", "10.0.0.9:8000"]
    pods.event("DELETED", pod("p2", "10.0.0.2"))
    assert store.addresses() == ["10.0.0.9:8000"]
    pods.replace([pod("p3", "10.0.0.3")])
    assert store.addresses() == ["10.0.0.3:8000"]


def test_a_target_port_change_republishes_every_pod():
    store = EndpointStore()
    pods = PodEndpoints(store, POOL)
    pods.replace([pod("p1", "10.0.0.1")])
    pods.set_pool(InferencePool("pool-a", selector=POOL.selector, target_ports=(9000,)))
    assert store.addresses() == ["10.0.0.1:9000"]
