"""The InferencePool v1 CRD's constraints and CEL rules, and the bundled
CRDs being the ones in config/crd."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from epp.api.validation import check

ROOT = Path(__file__).parents[3]

SPEC = {
    "selector": {"matchLabels": {"app": "vllm"}},
    "targetPorts": [{"number": 8000}],
    "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
}


def pool(**spec: Any) -> dict[str, Any]:
    merged = copy.deepcopy(SPEC)
    for key, value in spec.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": merged,
    }


CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("valid", pool(), None),
    ("no endpointPickerRef", pool(endpointPickerRef=None), None),
    ("selector missing", pool(selector=None), "spec.selector: Required value"),
    ("matchLabels missing", pool(selector={}), "spec.selector.matchLabels: Required value"),
    ("matchLabels empty", pool(selector={"matchLabels": {}}), "should have at least 1 properties"),
    (
        "matchLabels 65",
        pool(selector={"matchLabels": {f"k{i}": "v" for i in range(65)}}),
        "spec.selector.matchLabels: Too many: 65: must have at most 64 items",
    ),
    ("label value bad", pool(selector={"matchLabels": {"app": "-x"}}), "should match"),
    ("targetPorts missing", pool(targetPorts=None), "spec.targetPorts: Required value"),
    ("targetPorts empty", pool(targetPorts=[]), "should have at least 1 items"),
    ("targetPorts eight", pool(targetPorts=[{"number": 8000 + i} for i in range(8)]), None),
    ("targetPorts nine", pool(targetPorts=[{"number": 8000 + i} for i in range(9)]), "Too many: 9"),
    (
        "targetPorts duplicate",
        pool(targetPorts=[{"number": 8000}, {"number": 8000}]),
        'spec.targetPorts: Invalid value: "array": port number must be unique',
    ),
    ("port zero", pool(targetPorts=[{"number": 0}]), "should be greater than or equal to 1"),
    ("port 65536", pool(targetPorts=[{"number": 65536}]), "should be less than or equal to 65535"),
    ("appProtocol h2c", pool(appProtocol="kubernetes.io/h2c"), None),
    ("appProtocol bad", pool(appProtocol="grpc"), "spec.appProtocol: Unsupported value"),
    (
        "failureMode FailOpen",
        pool(endpointPickerRef={**SPEC["endpointPickerRef"], "failureMode": "FailOpen"}),
        None,
    ),
    (
        "failureMode bad",
        pool(endpointPickerRef={**SPEC["endpointPickerRef"], "failureMode": "Open"}),
        "spec.endpointPickerRef.failureMode: Unsupported value",
    ),
    (
        "service without port",
        pool(endpointPickerRef={"name": "epp"}),
        'spec.endpointPickerRef: Invalid value: "object": '
        "port is required when kind is 'Service'",
    ),
    (
        "other kind without port",
        pool(endpointPickerRef={"name": "epp", "kind": "Backend", "group": "x.io"}),
        None,
    ),
]


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pool_constraint(obj: dict, expected: str | None) -> None:
    found = [str(error) for error in check(obj).errors]
    if expected is None:
        assert found == []
    else:
        assert any(expected in error for error in found), found


def test_pool_defaults_failure_mode_and_protocol() -> None:
    spec = check(pool()).object["spec"]
    assert spec["endpointPickerRef"]["failureMode"] == "FailClose"
    assert spec["appProtocol"] == "http"


@pytest.mark.parametrize(
    "name", ["inferenceobjectives.llm-d.ai.yaml", "inferencepools.inference.networking.k8s.io.yaml"]
)
def test_bundled_crd_is_the_one_in_config(name: str) -> None:
    bundled = (ROOT / "epp" / "api" / "crds" / name).read_text()
    assert bundled == (ROOT / "config" / "crd" / name).read_text()
