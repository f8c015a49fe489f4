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
    REJECTED_FILTERED = "rejected-filtered"
    """A scheduling profile's filters kept no endpoint of a non-empty pool.
    The reference reads that as a busy pool, not a broken one, and answers
    it as saturation; so does its reason."""

    def __init__(self, value: str) -> None:
        self.reason = "rejected-saturated" if value == "rejected-filtered" else value

    @property
    def is_dispatched(self) -> bool:
        return self is Outcome.DISPATCHED
