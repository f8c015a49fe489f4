"""How a request's stay in the flow-control layer ends.

Every request ends with exactly one outcome. Each outcome carries the HTTP
status the live shell answers with and the reason string it puts in
`x-llm-d-request-dropped-reason` (the reference EPP's names).
"""

from __future__ import annotations

from enum import Enum


class Outcome(Enum):
    DISPATCHED = ("dispatched", 200)
    REJECTED_SATURATED = ("rejected-saturated", 429)
    REJECTED_NO_ENDPOINTS = ("rejected-no-endpoints", 503)
    REJECTED_TTL_EXPIRED = ("rejected-ttl-expired", 429)
    CANCELLED = ("rejected-context-cancelled", 503)
    REJECTED_SHUTTING_DOWN = ("rejected-shutting-down", 503)

    def __init__(self, reason: str, http_status: int) -> None:
        self.reason = reason
        self.http_status = http_status

    @property
    def is_dispatched(self) -> bool:
        return self is Outcome.DISPATCHED
