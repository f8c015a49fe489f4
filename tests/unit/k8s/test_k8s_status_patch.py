"""The Accepted condition patch: what changes, what stays, when nothing is sent."""

from __future__ import annotations

from datetime import UTC, datetime

from epp.k8s.status import ACCEPTED_MESSAGE, accepted_patch

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LATER = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)
PLACEHOLDER = {
    "type": "Ready",
    "status": "Unknown",
    "reason": "Pending",
    "message": "Waiting for controller",
    "lastTransitionTime": "1970-01-01T00:00:00Z",
}
OTHER = {
    "type": "Ready",
    "status": "True",
    "reason": "Configured",
    "message": "set by another controller",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def objective(conditions: list[dict], generation: int = 1) -> dict:
    return {
        "metadata": {"name": "o", "generation": generation, "resourceVersion": "42"},
        "status": {"conditions": conditions},
    }


def accepted(generation: int = 1, since: str = "2026-03-01T12:00:00Z") -> dict:
    return {
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": ACCEPTED_MESSAGE,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }


def test_the_placeholder_condition_is_replaced_by_accepted():
    patch = accepted_patch(objective([PLACEHOLDER]), NOW)
    assert patch["status"]["conditions"] == [accepted()]


def test_an_objective_without_status_gets_accepted():
    patch = accepted_patch({"metadata": {"generation": 3, "resourceVersion": "7"}}, NOW)
    assert patch["status"]["conditions"] == [accepted(3)]


def test_an_accepted_objective_needs_no_patch():
    assert accepted_patch(objective([accepted()]), LATER) is None


def test_the_patch_is_conditional_on_the_version_it_was_computed_from():
    assert accepted_patch(objective([PLACEHOLDER]), NOW)["metadata"] == {"resourceVersion": "42"}


def test_a_new_generation_keeps_the_transition_time():
    patch = accepted_patch(objective([accepted(1)], generation=2), LATER)
    assert patch["status"]["conditions"] == [accepted(2, since="2026-03-01T12:00:00Z")]


def test_a_status_change_moves_the_transition_time():
    rejected = {**accepted(), "status": "False", "reason": "Rejected"}
    patch = accepted_patch(objective([rejected]), LATER)
    assert patch["status"]["conditions"] == [accepted(since="2026-03-02T12:00:00Z")]


def test_other_controllers_conditions_stay_in_place():
    patch = accepted_patch(objective([OTHER, accepted(1)], generation=2), NOW)
    assert patch["status"]["conditions"] == [OTHER, accepted(2)]


def test_a_settled_condition_list_in_any_order_needs_no_patch():
    assert accepted_patch(objective([accepted(), OTHER]), LATER) is None
