"""The `Accepted` condition of an InferenceObjective, as a merge patch or nothing.

Every EPP that accepts an objective asks for the same condition: type
`Accepted`, status True, reason `Accepted`, a fixed message, and the
objective's own `metadata.generation` as observedGeneration. Nothing in it
depends on which EPP or pool writes it, so when several EPPs serve pools that
one objective applies to, the first write satisfies all of them and the
others write nothing (see epp/k8s/README.md for the whole argument).

The patch keeps every other condition (other controllers' types), drops the
CRD's placeholder default (type Ready, reason Pending), and carries the
resourceVersion it was computed from, so that the API server refuses it (409)
if the object changed in between instead of overwriting a newer state.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

ACCEPTED = "Accepted"
ACCEPTED_REASON = "Accepted"
ACCEPTED_MESSAGE = "The objective applies to an InferencePool served by an endpoint picker"
PLACEHOLDER_TYPE = "Ready"
PLACEHOLDER_REASON = "Pending"


def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC, seconds precision (metav1.Time)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _is_placeholder(condition: Mapping[str, Any]) -> bool:
    return (
        condition.get("type") == PLACEHOLDER_TYPE and condition.get("reason") == PLACEHOLDER_REASON
    )


def accepted_condition(obj: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The Accepted condition this objective should carry; lastTransitionTime
    stays as it is unless the status changes."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    current = next((c for c in conditions if c.get("type") == ACCEPTED), None)
    status = "True"
    unchanged = current is not None and current.get("status") == status
    return {
        "type": ACCEPTED,
        "status": status,
        "reason": ACCEPTED_REASON,
        "message": ACCEPTED_MESSAGE,
        "observedGeneration": obj["metadata"].get("generation", 0),
        "lastTransitionTime": current["lastTransitionTime"] if unchanged else timestamp(now),
    }


def accepted_patch(obj: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The merge patch that makes `obj` accepted, or None when it already is."""
    conditions = list((obj.get("status") or {}).get("conditions") or [])
    wanted = accepted_condition(obj, now)
    updated = [
        wanted if condition.get("type") == ACCEPTED else condition
        for condition in conditions
        if not _is_placeholder(condition)
    ]
    if wanted not in updated:
        updated.append(wanted)
    if updated == conditions:
        return None
    return {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "status": {"conditions": updated},
    }
