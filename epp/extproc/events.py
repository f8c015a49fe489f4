"""What the ext_proc stream machine hands out besides the ProcessingResponses to send."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.extproc.messages import ProcessingResponse
from epp.flowcontrol.request import FlowRequest, Usage


@dataclass(slots=True)
class AdmissionNeeded:
    """The request is complete: ask flow control, then feed the outcome back.

    The service offers it to `AdmissionController.offer(request)` (awaiting
    `wait(request)` when it queues) and calls `ExtProcStream.admitted(outcome)`
    (or `admission_failed()` if it raised). If the stream goes away
    meanwhile, the service withdraws the request.
    """

    request: FlowRequest


@dataclass(slots=True)
class Release:
    """The dispatched request is over: return its credit, report real usage.

    `usage` is None when the response reported none (flow control then
    keeps its estimate). The response's size, when its first body bytes came
    (None: no body), whether it streamed (SSE) and the server's HTTP status
    are for metrics only.
    """

    request: FlowRequest
    usage: Usage | None
    response_bytes: int = field(default=0, compare=False)
    first_byte_at: float | None = field(default=None, compare=False)
    streaming: bool = field(default=False, compare=False)
    upstream_status: int | None = field(default=None, compare=False)
    """The model server's HTTP status (None: no response headers came)."""

    def time_per_output_token(self, now: float) -> float | None:
        """The streamed response's mean time per output token after the
        first, ending at `now` (None: not streamed, or one token or none)."""
        first = self.first_byte_at
        usage = self.usage
        if not self.streaming or first is None or usage is None or usage.output_tokens < 2:
            return None
        return max(0.0, now - first) / (usage.output_tokens - 1)


@dataclass(slots=True)
class PrefillDone:
    """The response of a request sent through a prefill server began: its
    prefill stage is over (the decode server's sidecar starts the decode leg
    only once the prefill has answered), so its prefill credit returns."""

    request: FlowRequest


@dataclass(slots=True)
class FirstToken:
    """The first bytes of a streamed (SSE) response came: its server runs
    the request (a model server streams only what it generated). A whole,
    unstreamed response says so only at its end, so it sends none."""

    request: FlowRequest


@dataclass(slots=True)
class Rejected:
    """The request was answered locally with an error (already in the replies).

    `request` is None when it failed before a FlowRequest existed (400, 413).
    """

    http_status: int
    reason: str
    request: FlowRequest | None


Event = ProcessingResponse | AdmissionNeeded | Release | Rejected | PrefillDone | FirstToken
"""A ProcessingResponse means: send it to Envoy, in the order given."""
