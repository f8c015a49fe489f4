"""The request as the flow-control core sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from epp.flowcontrol.outcome import Outcome


class State(IntEnum):
    NEW = 0
    QUEUED = 1
    DISPATCHED = 2
    COMPLETED = 3
    DROPPED = 4


@dataclass(slots=True, eq=False)
class FlowRequest:
    """One inference request waiting for, or holding, a place in the pool.

    The caller fills the first block. The core owns the rest: callers read
    `state`, `outcome` and `endpoint`, and never write them.

    Times are seconds on the caller's clock. `ttl` and `ttft_slo` are
    durations; `ttl=None` means the request sets no TTL of its own.
    """

    request_id: str
    fairness_id: str
    priority: int
    arrival: float
    byte_size: int = 0
    input_tokens: int = 0
    ttl: float | None = None
    ttft_slo: float | None = None
    payload: Any = None

    state: State = State.NEW
    outcome: Outcome | None = None
    endpoint: str | None = None
    deadline: float = float("inf")
    order_key: float = 0.0
    seq: int = 0
    flow: Any = field(default=None, repr=False)
    prev: FlowRequest | None = field(default=None, repr=False)
    next: FlowRequest | None = field(default=None, repr=False)
    charged_input: float = 0.0
