from __future__ import annotations

import pytest

from epp.api.applicability import applies_to
from epp.api.labels import LabelSelector
from epp.api.models import InferenceObjective, InferencePool, PoolRef

POOL = InferencePool(name="pool", namespace="team", labels={"tier": "gpu", "zone": "a"})


def selecting(**selector: object) -> LabelSelector:
    return LabelSelector.from_dict(selector)


def expr(key: str, operator: str, *values: str) -> LabelSelector:
    return selecting(matchExpressions=[{"key": key, "operator": operator, "values": list(values)}])


CASES = [
    ("poolRef (v1alpha2) naming the pool", (PoolRef("pool"),), None, "team", True),
    (
        "poolRefs with the pool among others",
        (PoolRef("other"), PoolRef("pool")),
        None,
        "team",
        True,
    ),
    ("poolRefs naming other pools only", (PoolRef("other"), PoolRef("third")), None, "team", False),
    (
        "group mismatch",
        (PoolRef("pool", group="inference.networking.x-k8s.io"),),
        None,
        "team",
        False,
    ),
    ("empty (core) group", (PoolRef("pool", group=""),), None, "team", False),
    ("kind mismatch", (PoolRef("pool", kind="Service"),), None, "team", False),
    ("other namespace, same pool name", (PoolRef("pool"),), None, "elsewhere", False),
    ("matchLabels matching", (), selecting(matchLabels={"tier": "gpu"}), "team", True),
    ("matchLabels not matching", (), selecting(matchLabels={"tier": "cpu"}), "team", False),
    ("In matching", (), expr("tier", "In", "gpu", "tpu"), "team", True),
    ("In not matching", (), expr("tier", "In", "cpu"), "team", False),
    ("NotIn matching", (), expr("tier", "NotIn", "cpu"), "team", True),
    ("NotIn not matching", (), expr("tier", "NotIn", "gpu"), "team", False),
    ("Exists matching", (), expr("zone", "Exists"), "team", True),
    ("Exists not matching", (), expr("region", "Exists"), "team", False),
    ("DoesNotExist matching", (), expr("region", "DoesNotExist"), "team", True),
    ("DoesNotExist not matching", (), expr("zone", "DoesNotExist"), "team", False),
    (
        "selector matching in other namespace",
        (),
        selecting(matchLabels={"tier": "gpu"}),
        "elsewhere",
        False,
    ),
    (
        "poolRefs miss but selector matches",
        (PoolRef("other"),),
        expr("zone", "Exists"),
        "team",
        True,
    ),
    (
        "poolRefs match but selector misses",
        (PoolRef("pool"),),
        expr("zone", "DoesNotExist"),
        "team",
        True,
    ),
]


@pytest.mark.parametrize(
    ("refs", "selector", "namespace", "applies"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_applicability(
    refs: tuple, selector: LabelSelector | None, namespace: str, applies: bool
) -> None:
    objective = InferenceObjective("o", namespace, 1, refs, selector)
    assert applies_to(objective, POOL) is applies
