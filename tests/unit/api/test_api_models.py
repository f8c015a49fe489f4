from __future__ import annotations

import pytest

from epp.api.labels import LabelSelector
from epp.api.models import (
    EndpointPickerRef,
    FailureMode,
    InferenceObjective,
    InferencePool,
    InvalidObjectError,
    PoolRef,
    decode,
)


def manifest(version: str, spec: dict, namespace: str | None = "team") -> dict:
    metadata = {"name": "premium"}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"llm-d.ai/{version}",
        "kind": "InferenceObjective",
        "metadata": metadata,
        "spec": spec,
    }


def test_v1alpha2_pool_ref_becomes_a_one_entry_pool_refs() -> None:
    objective = decode(manifest("v1alpha2", {"priority": 3, "poolRef": {"name": "pool"}}))
    assert objective == InferenceObjective(
        name="premium",
        namespace="team",
        priority=3,
        pool_refs=(PoolRef("pool"),),
        api_version="llm-d.ai/v1alpha2",
    )


def test_v1_and_v1alpha2_pool_refs_normalise_to_the_same_shape() -> None:
    spec = {
        "priority": 3,
        "poolRefs": [{"name": "a"}, {"name": "b", "group": "x.io", "kind": "Pool"}],
    }
    v1 = decode(manifest("v1", spec))
    v1alpha2 = decode(manifest("v1alpha2", spec))
    assert v1.pool_refs == v1alpha2.pool_refs == (PoolRef("a"), PoolRef("b", "x.io", "Pool"))


def test_unset_priority_is_zero() -> None:
    assert decode(manifest("v1", {"poolRefs": [{"name": "a"}]})).priority == 0


def test_missing_namespace_is_default() -> None:
    assert (
        decode(manifest("v1", {"poolRefs": [{"name": "a"}]}, namespace=None)).namespace == "default"
    )


def test_pool_selector_is_parsed() -> None:
    objective = decode(manifest("v1", {"poolSelector": {"matchLabels": {"tier": "gpu"}}}))
    assert objective.pool_selector == LabelSelector.from_dict({"matchLabels": {"tier": "gpu"}})


def test_selector_operator_the_crd_allows_but_kubernetes_cannot_use_is_refused() -> None:
    spec = {"poolSelector": {"matchExpressions": [{"key": "k", "operator": "Equals"}]}}
    with pytest.raises(InvalidObjectError) as raised:
        decode(manifest("v1", spec))
    assert raised.value.errors[0].path == "spec.poolSelector.matchExpressions[0].operator"


def test_invalid_objective_raises_with_every_error() -> None:
    with pytest.raises(InvalidObjectError) as raised:
        decode(manifest("v1", {"priority": "x", "poolSelector": {}}))
    assert [e.path for e in raised.value.errors] == ["spec.priority", "spec.poolSelector"]


def test_pool_is_parsed_with_defaults() -> None:
    pool = decode(
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool", "labels": {"tier": "gpu"}},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm"}},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
            },
        }
    )
    assert pool == InferencePool(
        name="pool",
        labels={"tier": "gpu"},
        selector={"app": "vllm"},
        target_ports=(8000, 8001),
        endpoint_picker_ref=EndpointPickerRef(
            name="epp", port=9002, failure_mode=FailureMode.FAIL_CLOSE
        ),
    )
