from __future__ import annotations

from dataclasses import replace

import pytest

from epp.api.labels import LabelSelector
from epp.api.models import InferenceObjective, InferencePool, PoolRef
from epp.api.registry import ObjectiveRegistry, Resolution

POOL = InferencePool(name="pool", namespace="team", labels={"tier": "gpu"})


def objective(name: str, priority: int, **fields: object) -> InferenceObjective:
    fields.setdefault("pool_refs", (PoolRef("pool"),))
    return InferenceObjective(name=name, namespace="team", priority=priority, **fields)


@pytest.fixture
def published() -> list[list[int]]:
    return []


@pytest.fixture
def registry(published: list[list[int]]) -> ObjectiveRegistry:
    registry = ObjectiveRegistry(
        POOL, publish=lambda priorities: published.append(list(priorities))
    )
    registry.apply(objective("premium", 10))
    registry.apply(objective("batch", -5))
    return registry


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-llm-d-inference-objective": "premium"}, Resolution("premium", 10, True)),
        ({"x-gateway-inference-objective": "batch"}, Resolution("batch", -5, True)),
        (
            {"x-llm-d-inference-objective": "premium", "x-gateway-inference-objective": "batch"},
            Resolution("premium", 10, True),
        ),
        ({}, Resolution(None, 0, False)),
        ({"x-llm-d-inference-objective": "gold"}, Resolution("gold", 0, False)),
        (
            {"x-llm-d-inference-objective": "", "x-gateway-inference-objective": "batch"},
            Resolution("batch", -5, True),
        ),
    ],
    ids=["canonical", "alias", "both: canonical wins", "neither", "unknown", "empty canonical"],
)
def test_resolution_from_headers(
    registry: ObjectiveRegistry, headers: dict, expected: Resolution
) -> None:
    assert registry.resolve(headers) == expected


def test_unknown_objective_is_counted(registry: ObjectiveRegistry) -> None:
    registry.resolve({"x-llm-d-inference-objective": "gold"})
    registry.resolve({"x-llm-d-inference-objective": "gold"})
    registry.resolve({})
    assert registry.unknown_requests == 2


def test_priorities_in_use_are_published_with_zero(
    published: list[list[int]], registry: ObjectiveRegistry
) -> None:
    assert published[-1] == [-5, 0, 10]


def test_publishes_only_when_the_set_changes(
    published: list[list[int]], registry: ObjectiveRegistry
) -> None:
    count = len(published)
    registry.apply(objective("gold", 10))
    assert len(published) == count


def test_objective_for_another_pool_is_not_kept(registry: ObjectiveRegistry) -> None:
    assert registry.apply(objective("other", 7, pool_refs=(PoolRef("other"),))) is False
    assert registry.resolve({"x-llm-d-inference-objective": "other"}).known is False
    assert 7 not in registry.priorities


def test_objective_in_another_namespace_is_ignored(registry: ObjectiveRegistry) -> None:
    assert registry.apply(replace(objective("premium", 99), namespace="elsewhere")) is False
    assert registry.resolve({"x-llm-d-inference-objective": "premium"}).priority == 10


def test_priority_change_applies_to_requests_resolved_afterwards(
    registry: ObjectiveRegistry,
) -> None:
    before = registry.resolve({"x-llm-d-inference-objective": "premium"})
    registry.apply(objective("premium", 20))
    after = registry.resolve({"x-llm-d-inference-objective": "premium"})
    assert (before.priority, after.priority) == (10, 20)


def test_pool_selector_that_stops_matching_stops_applying(registry: ObjectiveRegistry) -> None:
    registry.apply(
        objective(
            "gpu",
            3,
            pool_refs=(),
            pool_selector=LabelSelector.from_dict({"matchLabels": {"tier": "gpu"}}),
        )
    )
    assert registry.resolve({"x-llm-d-inference-objective": "gpu"}).priority == 3
    registry.set_pool(replace(POOL, labels={"tier": "cpu"}))
    assert registry.resolve({"x-llm-d-inference-objective": "gpu"}) == Resolution("gpu", 0, False)
    assert 3 not in registry.priorities


def test_pool_labels_that_start_matching_make_a_known_objective_apply(
    registry: ObjectiveRegistry,
) -> None:
    selector = LabelSelector.from_dict({"matchLabels": {"tier": "tpu"}})
    assert registry.apply(objective("tpu", 4, pool_refs=(), pool_selector=selector)) is False
    registry.set_pool(replace(POOL, labels={"tier": "tpu"}))
    assert registry.resolve({"x-llm-d-inference-objective": "tpu"}).priority == 4


def test_objective_updated_to_stop_matching_stops_applying(registry: ObjectiveRegistry) -> None:
    assert registry.apply(objective("premium", 10, pool_refs=(PoolRef("other"),))) is False
    assert registry.get("premium") is None


def test_delete_forgets_the_objective_and_publishes_the_smaller_set(
    published: list[list[int]], registry: ObjectiveRegistry
) -> None:
    assert registry.delete("batch") is True
    assert registry.resolve({"x-llm-d-inference-objective": "batch"}).known is False
    assert published[-1] == [0, 10]


def test_delete_hands_out_no_request_and_touches_nothing_else(registry: ObjectiveRegistry) -> None:
    """Requests already queued keep their priority: a resolution is a value the
    registry never sees again, so deleting the objective cannot change it."""
    queued = registry.resolve({"x-llm-d-inference-objective": "batch"})
    registry.delete("batch")
    assert queued == Resolution("batch", -5, True)


def test_delete_of_unknown_name_is_a_no_op(
    published: list[list[int]], registry: ObjectiveRegistry
) -> None:
    count = len(published)
    assert registry.delete("nothing") is False
    assert len(published) == count


def test_replace_sets_the_whole_set(registry: ObjectiveRegistry) -> None:
    registry.replace([objective("standard", 0), objective("gold", 7)])
    assert [o.name for o in registry.objectives()] == ["gold", "standard"]
    assert registry.priorities == frozenset({0, 7})
