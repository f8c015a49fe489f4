"""The request as the flow-control core sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from epp.flowcontrol.outcome import Outcome


@dataclass(slots=True)
class Usage:
    """The tokens a finished request used, as its model server reported them:
    what fairness charges for real in place of the estimate it charged at
    dispatch. A completion without a report carries None instead."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int | None = None
    """Prompt tokens the server read from its cache; None when it did not say."""


class State(IntEnum):
    NEW = 0
    QUEUED = 1
    DISPATCHED = 2
    COMPLETED = 3
    DROPPED = 4


@dataclass(slots=True, eq=False)
class QueueEntry:
    """The fields the core touches on a request as it queues and dispatches it:
    the base of `FlowRequest`, so that they share the request's first cache line.

    CPython lays out a class's own slots in the order of their names, after
    those of its bases, so declaration order cannot group them. Six slots
    fill a line after the object header; a request block (GC header
    included) is 192 bytes and starts each object on a line, so a dispatch
    touches the first line of its request plus `byte_size` in the second, an
    enqueue the first line of the flow's old tail, and the request that
    becomes a flow's head only its first line.
    """

    next: FlowRequest | None = field(default=None, init=False, repr=False)
    prev: FlowRequest | None = field(default=None, init=False, repr=False)
    flow: Any = field(default=None, init=False, repr=False)
    state: State = field(default=State.NEW, init=False)
    outcome: Outcome | None = field(default=None, init=False)
    endpoint: str | None = field(default=None, init=False)


ADOPTED_SEQ = 0
"""The `seq` of an adopted request (`FlowController.adopt`: placed by an
earlier decider): before everything this core sent, so a gate that counts
what was sent since its last sample of a server takes it as one the server
already shows, not as one on its way."""


@dataclass(slots=True, eq=False)
class FlowRequest(QueueEntry):
    """One inference request waiting for, or holding, a place in the pool.

    The caller fills the fields the constructor takes, in this order:
    request_id, fairness_id, priority, arrival, byte_size, input_tokens, ttl,
    ttft_slo, payload. The core owns the rest: callers read `state`, `outcome`
    and `endpoint`, and never write them.

    Times are seconds on the caller's clock. `ttl` and `ttft_slo` are
    durations; `ttl=None` means the request sets no TTL of its own.
    """

    request_id: str
    fairness_id: str
    priority: int
    arrival: float
    byte_size: int = 0
    input_tokens: int = 0
    charged_input: float = field(default=0.0, init=False, repr=False)
    ttl: float | None = None
    ttft_slo: float | None = None
    payload: Any = None

    deadline: float = field(default=float("inf"), init=False)
    order_key: float = field(default=0.0, init=False, repr=False)
    seq: int = field(default=0, init=False, repr=False)
    """Its place in the order of arrival at this core (from 1);
    `ADOPTED_SEQ` for a request an earlier decider placed."""
    running: bool = field(default=False, init=False, repr=False)
    """Its first output token reached the EPP, so its server runs it
    (written by the gate, `on_first_token`)."""
