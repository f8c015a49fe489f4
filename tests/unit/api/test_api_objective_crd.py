"""Every schema constraint and CEL rule of the InferenceObjective CRD, with a
case that passes and one that fails, in each version that has it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.api.validation import check

BOTH = ("v1", "v1alpha2")
SEED = Path(__file__).parents[3] / "config" / "crd" / "inferenceobjectives.llm-d.ai.yaml"


def objective(version: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict:
    obj = {
        "apiVersion": f"llm-d.ai/{version}",
        "kind": "InferenceObjective",
        "metadata": {"name": "tier", "namespace": "default"},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def errors(obj: dict) -> list[str]:
    return [str(error) for error in check(obj).errors]


REF = {"poolRefs": [{"name": "pool"}]}


def refs(**ref: Any) -> dict[str, Any]:
    return {"poolRefs": [{"name": "pool", **ref}]}


def selector(**fields: Any) -> dict[str, Any]:
    return {"poolSelector": fields}


def condition(**fields: Any) -> dict[str, Any]:
    base = {
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


# (case id, spec, expected error or None when valid)
SPEC_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("priority unset", REF, None),
    ("priority negative", {**REF, "priority": -10}, None),
    ("priority int32 max", {**REF, "priority": 2**31 - 1}, None),
    ("priority int32 min", {**REF, "priority": -(2**31)}, None),
    (
        "priority above int32",
        {**REF, "priority": 2**31},
        "spec.priority: Invalid value: 2147483648: "
        'spec.priority in body must be of type int32: "2147483648"',
    ),
    ("priority below int32", {**REF, "priority": -(2**31) - 1}, "must be of type int32"),
    (
        "priority not an integer",
        {**REF, "priority": "high"},
        'spec.priority: Invalid value: "string": spec.priority in body must be of type integer',
    ),
    ("priority a float", {**REF, "priority": 1.5}, "must be of type integer"),
    ("poolRefs one", REF, None),
    ("poolRefs sixteen", {"poolRefs": [{"name": f"p{i}"} for i in range(16)]}, None),
    (
        "poolRefs empty",
        {"poolRefs": [], "poolSelector": {"matchLabels": {"a": "b"}}},
        "spec.poolRefs: Invalid value: 0: spec.poolRefs in body should have at least 1 items",
    ),
    (
        "poolRefs seventeen",
        {"poolRefs": [{"name": f"p{i}"} for i in range(17)]},
        "spec.poolRefs: Too many: 17: must have at most 16 items",
    ),
    ("poolRefs not a list", {"poolRefs": {"name": "pool"}}, "must be of type array"),
    (
        "poolRefs duplicate name",
        {"poolRefs": [{"name": "a"}, {"name": "a", "group": "other.io"}]},
        'spec.poolRefs[1]: Duplicate value: {"name": "a"}',
    ),
    (
        "poolRefs same name in other position is unique",
        {"poolRefs": [{"name": "a"}, {"name": "b"}]},
        None,
    ),
    (
        "poolRefs name missing",
        {"poolRefs": [{"group": "x.io"}]},
        "spec.poolRefs[0].name: Required value",
    ),
    (
        "poolRefs name empty",
        refs(name=""),
        'spec.poolRefs[0].name: Invalid value: "": '
        "spec.poolRefs[0].name in body should be at least 1 chars long",
    ),
    ("poolRefs name 253", refs(name="n" * 253), None),
    (
        "poolRefs name 254",
        refs(name="n" * 254),
        "spec.poolRefs[0].name: Too long: may not be more than 253",
    ),
    ("poolRefs group empty allowed", refs(group=""), None),
    ("poolRefs group dotted", refs(group="inference.networking.x-k8s.io"), None),
    (
        "poolRefs group bad pattern",
        refs(group="Bad_Group"),
        "spec.poolRefs[0].group in body should match",
    ),
    ("poolRefs group 253", refs(group="a" * 253), None),
    ("poolRefs group 254", refs(group="a" * 254), "spec.poolRefs[0].group: Too long"),
    ("poolRefs kind ok", refs(kind="InferencePool"), None),
    (
        "poolRefs kind empty",
        refs(kind=""),
        "spec.poolRefs[0].kind in body should be at least 1 chars long",
    ),
    ("poolRefs kind bad pattern", refs(kind="1Pool"), "spec.poolRefs[0].kind in body should match"),
    ("poolRefs kind 63", refs(kind="K" * 63), None),
    (
        "poolRefs kind 64",
        refs(kind="K" * 64),
        "spec.poolRefs[0].kind: Too long: may not be more than 63",
    ),
    ("poolSelector matchLabels", selector(matchLabels={"tier": "gpu"}), None),
    (
        "poolSelector matchExpressions",
        selector(matchExpressions=[{"key": "tier", "operator": "In", "values": ["gpu"]}]),
        None,
    ),
    (
        "poolSelector empty",
        selector(),
        'spec.poolSelector: Invalid value: "object": poolSelector must not be empty',
    ),
    (
        "poolSelector with empty parts",
        selector(matchLabels={}, matchExpressions=[]),
        'spec.poolSelector: Invalid value: "object": poolSelector must not be empty',
    ),
    ("poolSelector not an object", {"poolSelector": "tier=gpu"}, "must be of type object"),
    (
        "poolSelector label value not a string",
        selector(matchLabels={"tier": 1}),
        'spec.poolSelector.matchLabels.tier: Invalid value: "integer"',
    ),
    (
        "poolSelector expression key missing",
        selector(matchExpressions=[{"operator": "Exists"}]),
        "spec.poolSelector.matchExpressions[0].key: Required value",
    ),
    (
        "poolSelector expression operator missing",
        selector(matchExpressions=[{"key": "tier"}]),
        "spec.poolSelector.matchExpressions[0].operator: Required value",
    ),
    (
        "poolSelector expression values not strings",
        selector(matchExpressions=[{"key": "tier", "operator": "In", "values": [1]}]),
        "spec.poolSelector.matchExpressions[0].values[0]: Invalid value",
    ),
    ("poolSelector and poolRefs together", {**REF, **selector(matchLabels={"a": "b"})}, None),
    ("unknown spec field", {**REF, "weight": 3}, "spec.weight: Unknown field"),
]

V1_RULES: list[tuple[str, dict[str, Any], str | None]] = [
    ("v1 poolRefs alone satisfies the rule", REF, None),
    ("v1 poolSelector alone satisfies the rule", selector(matchLabels={"a": "b"}), None),
    (
        "v1 neither poolRefs nor poolSelector",
        {"priority": 1},
        'spec: Invalid value: "object": either poolRefs or poolSelector must be set',
    ),
    (
        "v1 prunes poolRef, so a poolRef alone sets nothing",
        {"poolRef": {"name": "pool"}},
        "either poolRefs or poolSelector must be set",
    ),
    (
        "v1 does not declare poolRef",
        {**REF, "poolRef": {"name": "pool"}},
        "spec.poolRef: Unknown field",
    ),
]

V1ALPHA2_RULES: list[tuple[str, dict[str, Any], str | None]] = [
    ("v1alpha2 poolRef alone", {"poolRef": {"name": "pool"}}, None),
    ("v1alpha2 poolRefs alone", REF, None),
    ("v1alpha2 poolSelector alone", selector(matchLabels={"a": "b"}), None),
    (
        "v1alpha2 none of the three",
        {"priority": 1},
        'spec: Invalid value: "object": one of poolRef, poolRefs or poolSelector must be set',
    ),
    (
        "v1alpha2 poolRef with poolRefs",
        {"poolRef": {"name": "pool"}, **REF},
        'spec: Invalid value: "object": poolRef cannot be combined with poolRefs or poolSelector',
    ),
    (
        "v1alpha2 poolRef with poolSelector",
        {"poolRef": {"name": "pool"}, **selector(matchLabels={"a": "b"})},
        "poolRef cannot be combined with poolRefs or poolSelector",
    ),
    (
        "v1alpha2 poolRef name missing",
        {"poolRef": {"kind": "InferencePool"}},
        "spec.poolRef.name: Required value",
    ),
    (
        "v1alpha2 poolRef name empty",
        {"poolRef": {"name": ""}},
        "spec.poolRef.name in body should be at least 1",
    ),
    ("v1alpha2 poolRef name 254", {"poolRef": {"name": "n" * 254}}, "spec.poolRef.name: Too long"),
    (
        "v1alpha2 poolRef group bad",
        {"poolRef": {"name": "p", "group": "A"}},
        "spec.poolRef.group in body should match",
    ),
    (
        "v1alpha2 poolRef group 254",
        {"poolRef": {"name": "p", "group": "a" * 254}},
        "spec.poolRef.group: Too long",
    ),
    (
        "v1alpha2 poolRef kind empty",
        {"poolRef": {"name": "p", "kind": ""}},
        "spec.poolRef.kind in body should be at least 1",
    ),
    (
        "v1alpha2 poolRef kind bad",
        {"poolRef": {"name": "p", "kind": "-x"}},
        "spec.poolRef.kind in body should match",
    ),
    (
        "v1alpha2 poolRef kind 64",
        {"poolRef": {"name": "p", "kind": "K" * 64}},
        "spec.poolRef.kind: Too long",
    ),
]


def _check_case(version: str, spec: dict, expected: str | None, status: dict | None = None) -> None:
    found = errors(objective(version, copy.deepcopy(spec), status))
    if expected is None:
        assert found == []
    else:
        assert any(expected in error for error in found), found


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.parametrize(
    ("spec", "expected"), [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES]
)
def test_spec_constraint(version: str, spec: dict, expected: str | None) -> None:
    _check_case(version, spec, expected)


@pytest.mark.parametrize(
    ("spec", "expected"), [c[1:] for c in V1_RULES], ids=[c[0] for c in V1_RULES]
)
def test_v1_rule(spec: dict, expected: str | None) -> None:
    _check_case("v1", spec, expected)


@pytest.mark.parametrize(
    ("spec", "expected"), [c[1:] for c in V1ALPHA2_RULES], ids=[c[0] for c in V1ALPHA2_RULES]
)
def test_v1alpha2_rule(spec: dict, expected: str | None) -> None:
    _check_case("v1alpha2", spec, expected)


STATUS_CASES: list[tuple[str, list[dict], str | None]] = [
    ("condition valid", [condition()], None),
    ("eight conditions", [condition(type=f"T{i}") for i in range(8)], None),
    (
        "nine conditions",
        [condition(type=f"T{i}") for i in range(9)],
        "status.conditions: Too many: 9",
    ),
    (
        "duplicate type",
        [condition(), condition()],
        'status.conditions[1]: Duplicate value: {"type": "Accepted"}',
    ),
    *[
        (
            f"{field} missing",
            [condition(**{field: None})],
            f"status.conditions[0].{field}: Required value",
        )
        for field in ("lastTransitionTime", "message", "reason", "status", "type")
    ],
    (
        "lastTransitionTime not a date",
        [condition(lastTransitionTime="yesterday")],
        "must be of type date-time",
    ),
    ("message at limit", [condition(message="m" * 32768)], None),
    (
        "message too long",
        [condition(message="m" * 32769)],
        "status.conditions[0].message: Too long",
    ),
    ("observedGeneration zero", [condition(observedGeneration=0)], None),
    (
        "observedGeneration negative",
        [condition(observedGeneration=-1)],
        "should be greater than or equal to 0",
    ),
    (
        "observedGeneration above int64",
        [condition(observedGeneration=2**63)],
        "must be of type int64",
    ),
    ("reason empty", [condition(reason="")], "reason in body should be at least 1 chars long"),
    ("reason bad pattern", [condition(reason="not ok")], "reason in body should match"),
    ("reason too long", [condition(reason="R" * 1025)], "status.conditions[0].reason: Too long"),
    (
        "status not in enum",
        [condition(status="Maybe")],
        'status.conditions[0].status: Unsupported value: "Maybe": '
        'supported values: "True", "False", "Unknown"',
    ),
    ("type with domain", [condition(type="example.com/Ready")], None),
    ("type bad pattern", [condition(type="-Ready")], "type in body should match"),
    ("type too long", [condition(type="T" * 317)], "status.conditions[0].type: Too long"),
]


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.parametrize(
    ("conditions", "expected"), [c[1:] for c in STATUS_CASES], ids=[c[0] for c in STATUS_CASES]
)
def test_status_constraint(version: str, conditions: list[dict], expected: str | None) -> None:
    _check_case(version, REF, expected, {"conditions": conditions})


@pytest.mark.parametrize("version", BOTH)
def test_pool_refs_default_group_and_kind(version: str) -> None:
    spec = check(objective(version, {"poolRefs": [{"name": "pool"}]})).object["spec"]
    assert spec["poolRefs"] == [
        {"name": "pool", "group": "inference.networking.k8s.io", "kind": "InferencePool"}
    ]


def test_v1alpha2_pool_ref_defaults_group_and_kind() -> None:
    spec = check(objective("v1alpha2", {"poolRef": {"name": "pool"}})).object["spec"]
    assert spec["poolRef"] == {
        "name": "pool",
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
    }


def test_v1alpha2_status_defaults_to_a_pending_ready_condition() -> None:
    status = check(objective("v1alpha2", REF, {})).object["status"]
    assert status["conditions"][0]["type"] == "Ready"
    assert status["conditions"][0]["reason"] == "Pending"


def test_v1_status_has_no_default_condition() -> None:
    assert check(objective("v1", REF, {})).object["status"] == {}


def test_explicit_values_are_not_defaulted() -> None:
    spec = check(objective("v1", refs(group="", kind="Other"))).object["spec"]
    assert spec["poolRefs"][0] == {"name": "pool", "group": "", "kind": "Other"}


def test_null_fields_are_dropped_before_defaulting() -> None:
    spec = check(objective("v1", refs(group=None))).object["spec"]
    assert spec["poolRefs"][0]["group"] == "inference.networking.k8s.io"


def test_lenient_mode_prunes_unknown_fields_without_errors() -> None:
    checked = check(objective("v1", {**REF, "poolRef": {"name": "pool"}}), strict=False)
    assert checked.errors == []
    assert "poolRef" not in checked.object["spec"]


def test_metadata_name_is_required() -> None:
    obj = objective("v1", REF)
    obj["metadata"] = {"namespace": "default"}
    assert "metadata.name: Required value: name or generateName is required" in errors(obj)


def test_metadata_name_must_be_a_dns_subdomain() -> None:
    obj = objective("v1", REF)
    obj["metadata"]["name"] = "Premium_Tier"
    assert any(e.startswith('metadata.name: Invalid value: "Premium_Tier"') for e in errors(obj))


def test_every_rule_of_the_seed_crd_is_covered() -> None:
    """A new CEL rule in the CRD must get its own cases above."""
    crd = yaml.safe_load(SEED.read_text())
    messages = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", ()):
                messages.add(rule["message"])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(crd)
    covered = " ".join(str(expected) for *_, expected in SPEC_CASES + V1_RULES + V1ALPHA2_RULES)
    assert messages and all(message in covered for message in messages)
