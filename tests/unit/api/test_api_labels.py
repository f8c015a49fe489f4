from __future__ import annotations

import pytest

from epp.api.labels import LabelSelector, SelectorError

LABELS = {"tier": "gpu", "zone": "a"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({"matchLabels": {"tier": "gpu"}}, True),
        ({"matchLabels": {"tier": "cpu"}}, False),
        ({"matchLabels": {"tier": "gpu", "zone": "b"}}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "tpu"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu"]}]}, False),
        ({"matchExpressions": [{"key": "missing", "operator": "In", "values": ["x"]}]}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, False),
        ({"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["x"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "missing", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "missing", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"tier": "gpu"},
                "matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}],
            },
            False,
        ),
    ],
)
def test_selector_matches_like_kubernetes(selector: dict, matches: bool) -> None:
    assert LabelSelector.from_dict(selector).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("expression", "path"),
    [
        ({"key": "k", "operator": "Equals", "values": ["v"]}, "matchExpressions[0].operator"),
        ({"key": "k", "operator": "In", "values": []}, "matchExpressions[0].values"),
        ({"key": "k", "operator": "NotIn"}, "matchExpressions[0].values"),
        ({"key": "k", "operator": "Exists", "values": ["v"]}, "matchExpressions[0].values"),
        ({"key": "k", "operator": "DoesNotExist", "values": ["v"]}, "matchExpressions[0].values"),
    ],
)
def test_invalid_expression_is_refused_with_its_path(expression: dict, path: str) -> None:
    with pytest.raises(SelectorError) as raised:
        LabelSelector.from_dict({"matchExpressions": [expression]})
    assert raised.value.path == path
