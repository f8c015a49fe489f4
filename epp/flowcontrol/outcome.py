"""How a request's stay in the flow-control layer ends.

Every request ends with exactly one outcome. Its `reason` is the reference
EPP's name for it, which the live shell puts in
`x-llm-d-request-dropped-reason`; the HTTP status is the edge's business
(`epp.extproc.stream.REJECTION_STATUS`).
"""

from __future__ import annotations

from enum import Enum


class Outcome(Enum):
    DISPATCHED = "dispatched"
    REJECTED_SATURATED = "rejected-saturated"
    REJECTED_NO_ENDPOINTS = "rejected-no-endpoints"
    REJECTED_TTL_EXPIRED = "rejected-ttl-expired"
    CANCELLED = "rejected-context-cancelled"
    REJECTED_SHUTTING_DOWN = "rejected-shutting-down"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    @property
    def is_dispatched(self) -> bool:
        return self is Outcome.DISPATCHED
