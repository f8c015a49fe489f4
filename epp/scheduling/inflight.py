"""What this EPP has in flight per endpoint, in requests and prompt tokens:
the reference's `inflight-load-producer`, for the plugins that read it
(`token-load-scorer`, `utilization-filter`'s `active-requests`,
`prefix-cache-affinity-filter`'s TTFT load gate).

`InFlightLoad` is a gate that never closes: `build_core` puts it beside the
configured gate when the scheduling configuration has such a plugin
(`needs_in_flight_load`), so it is told of every dispatch and completion.
As the reference's producer: a request is charged, at dispatch, the part
of its prompt not cached at its endpoint (its tokens less the cached tokens
the prefix index predicted there, `InferenceRequest.prefix_match`), and
gives them back at its first token (the prefill is done: what is left is
decode) or at its end, whichever is first; it counts as a request until it
ends. So tokens in flight are the prefill work an endpoint has ahead of a
new request.

Costs: O(1) per dispatch, completion and read.
"""

from __future__ import annotations

from epp.flowcontrol.request import FlowRequest
from epp.scheduling.request import InferenceRequest


def uncached_tokens(request: FlowRequest) -> int:
    """`request`'s prompt tokens less those predicted cached where it was placed."""
    tokens = max(0, request.input_tokens or 0)
    payload = request.payload
    if isinstance(payload, InferenceRequest) and payload.prefix_match is not None:
        return max(0, tokens - payload.prefix_match.cached_tokens)
    return tokens


class InFlightLoad:
    __slots__ = ("_charged", "_requests", "_tokens")

    def __init__(self) -> None:
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._charged: dict[FlowRequest, tuple[str, int]] = {}
        """Who is counted, where, and for how many tokens."""

    def requests_at(self, endpoint: str) -> int:
        return self._requests.get(endpoint, 0)

    def tokens_at(self, endpoint: str) -> int:
        return self._tokens.get(endpoint, 0)

    # -- the Gate protocol ---------------------------------------------------

    def is_open(self, priority: int) -> bool:
        return True

    def on_dispatch(self, request: FlowRequest) -> None:
        endpoint = request.endpoint
        if endpoint is None or request in self._charged:
            return
        tokens = uncached_tokens(request)
        self._charged[request] = (endpoint, tokens)
        self._requests[endpoint] = self._requests.get(endpoint, 0) + 1
        self._tokens[endpoint] = self._tokens.get(endpoint, 0) + tokens

    def on_first_token(self, request: FlowRequest) -> None:
        """`request`'s prompt is prefilled: its tokens leave; it stays a request."""
        charged = self._charged.get(request)
        if charged is None or not charged[1]:
            return
        endpoint, tokens = charged
        self._charged[request] = (endpoint, 0)
        self._tokens[endpoint] -= tokens

    def on_complete(self, request: FlowRequest) -> None:
        charged = self._charged.pop(request, None)
        if charged is None:
            return
        endpoint, tokens = charged
        left = self._requests[endpoint] - 1
        if left:
            self._requests[endpoint] = left
            self._tokens[endpoint] -= tokens
        else:
            del self._requests[endpoint]
            del self._tokens[endpoint]
