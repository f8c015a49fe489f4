"""One ext_proc `Process` stream as a sans-I/O state machine.

ProcessingRequests go in (`receive`), events come out: ProcessingResponses to
send in order, `AdmissionNeeded` when the request is complete, `Release` when
a dispatched request is over, `Rejected` when it was answered with an error.
The machine never awaits anything; the adapter resolves `AdmissionNeeded` and
feeds the outcome back with `admitted`.

Phases (Envoy: headers SEND, bodies FULL_DUPLEX_STREAMED, trailers SEND):

    REQUEST_HEADERS --headers--> REQUEST_BODY --body EoS / trailers--> ADMITTING
    ADMITTING --dispatched--> UPSTREAM --response headers--> RESPONSE_BODY
    RESPONSE_BODY --body EoS / trailers--> DONE (Release)
    any phase before dispatch --error--> DONE (ImmediateResponse, Rejected)

Choices:
- A request whose headers carry end_of_stream (no body: `GET /v1/models`,
  which SDKs and benchmark tools call first) goes at once to a random ready
  endpoint, as in the reference, without flow control or scheduling (500
  when there is none).
- With `models-responder`, `GET /v1/models` is answered here with the
  union of the endpoints' model lists (`StreamSettings.models`), 503 while
  none has reported one; it reaches no endpoint.
- A body over `max_body_bytes` (by Content-Length or as it arrives) gets 413
  at once; the rest is not buffered.
- Request headers, body and trailers get no reply until admission decides;
  then the header reply, the body in chunks of <= 62,000 bytes (EoS on the
  last unless the request ended with trailers) and the trailers reply go out
  together, in that order.
- A message out of order before dispatch is answered with 500; after dispatch
  it is ignored. Messages after the end are ignored. Nothing raises.
- Non-streamed responses are echoed chunk by chunk and a copy (up to
  `max_body_bytes`) is kept for usage, except when the model name was
  rewritten: then the body is held to the end so `"model"` can be restored in
  one piece. SSE responses are always echoed at once.
- The reply to the response headers adds what the scheduler's plugins wrote
  for the client (`InferenceRequest.response_headers`: the session token).
- `close()` (stream ended, for any reason) releases a dispatched request that
  was not released yet, with the usage seen so far.
- Of an SSE response, the time between consecutive body chunks goes to
  `StreamSettings.chunk_gaps` as each chunk arrives (the reference's
  inter-token latency): one histogram per request's labels, no buffer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from epp.api.address import address_ip
from epp.extproc import headers as h
from epp.extproc import messages
from epp.extproc.events import (
    AdmissionNeeded,
    Event,
    FirstToken,
    PrefillDone,
    Rejected,
    Release,
)
from epp.extproc.messages import ProcessingRequest
from epp.extproc.openai import Api, BadRequest, with_priority
from epp.extproc.parsers import DEFAULT_PARSERS, ParserSet, parser_set
from epp.extproc.usage import ModelNameRestorer, SseUsageReader, Usage, usage_from_json
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.request import InferenceRequest
from epp.scheduling.stages import prefiller_of

PriorityResolver = Callable[[Mapping[str, str]], int]
"""Request headers -> priority (the objective registry's lookup)."""


class Observer(Protocol):
    def add(self, value: float) -> None: ...


ChunkGaps = Callable[[FlowRequest], Observer]
"""Where a request's gaps between SSE chunks go (a histogram for its labels)."""

REJECTION_STATUS: dict[Outcome, int] = {
    Outcome.REJECTED_SATURATED: 429,
    Outcome.REJECTED_FILTERED: 429,
    Outcome.REJECTED_TTL_EXPIRED: 429,
    Outcome.REJECTED_NO_ENDPOINTS: 503,
    Outcome.CANCELLED: 503,
    Outcome.REJECTED_SHUTTING_DOWN: 503,
}
"""The HTTP status of a request flow control ended, as the reference EPP answers
(its `outcome.reason` goes in `x-llm-d-request-dropped-reason`)."""


@dataclass(slots=True, frozen=True)
class StreamSettings:
    """Limits of one request. Requests over the header limits get 431: Envoy's
    own limits are set above these (config/envoy/), so that an oversized
    request gets a clear answer from the EPP instead of a closed connection."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_header_count: int = 1000
    max_header_bytes: int = 64 * 1024
    default_fairness_id: str = "default-flow"
    default_model: str | None = None
    """The model of a request body without `model`; None: 400, as the reference."""
    honour_subset: bool = True
    """Follow Envoy's endpoint subset hint (`--disable-endpoint-subset-filter` turns it off)."""
    parsers: ParserSet = field(default_factory=lambda: parser_set(DEFAULT_PARSERS))
    """Which parser reads a body, by path (the configuration's parsers)."""
    any_endpoint: Callable[[], str | None] | None = None
    """A random ready endpoint, for a request without a body (GET /v1/models),
    which the reference sends there without scheduling; None: such a request
    gets 400."""
    chunk_gaps: ChunkGaps | None = None
    """Told the seconds between consecutive chunks of each SSE response (metrics)."""
    models: Callable[[], bytes | None] | None = None
    """Set (`models-responder`): the union of the endpoints' model lists, which
    answers `GET /v1/models` here (200), or None while no endpoint has
    reported one (503); None: such a request goes to an endpoint."""
    priority_in_body: Callable[[FlowRequest], int | None] | None = None
    """Set (`requestHandler.propagatePriority`): the `priority` a dispatched
    request's forwarded body carries, replacing the client's own: its
    objective's priority in its endpoint's engine convention
    (`openai.engine_priority_on`; under `--workers`, as the owner's DECISION
    said, None when the owner no longer propagates it); None (the default,
    as the reference's): the body's `priority` goes upstream as the client
    sent it."""


MODELS_PATH = "/v1/models"


def _lists_models(headers: Mapping[str, str]) -> bool:
    """Whether the request is the OpenAI model list: GET `/v1/models`, a
    trailing slash and a query string allowed, as the reference matches it."""
    if headers.get(h.METHOD) != "GET":
        return False
    return headers.get(h.PATH, "").split("?", 1)[0].rstrip("/") == MODELS_PATH


class Phase(Enum):
    REQUEST_HEADERS = "request-headers"
    REQUEST_BODY = "request-body"
    ADMITTING = "admitting"
    UPSTREAM = "upstream"
    RESPONSE_BODY = "response-body"
    DONE = "done"


def _new_request_id() -> str:
    return uuid.uuid4().hex


class ExtProcStream:
    """The EPP side of one HTTP request's ext_proc stream."""

    __slots__ = (
        "_body",
        "_body_size",
        "_document",
        "_first_byte_at",
        "_gaps",
        "_held",
        "_last_chunk_at",
        "_new_request_id",
        "_priority_of",
        "_released",
        "_request_trailers",
        "_response_bytes",
        "_response_copy",
        "_response_copy_size",
        "_restorer",
        "_settings",
        "_sse",
        "_subset",
        "_ttft_slo",
        "_ttl",
        "_upstream_body",
        "_upstream_status",
        "headers",
        "phase",
        "request",
        "usage",
    )

    def __init__(
        self,
        priority_of: PriorityResolver,
        settings: StreamSettings | None = None,
        new_request_id: Callable[[], str] = _new_request_id,
    ) -> None:
        self._priority_of = priority_of
        self._settings = settings or StreamSettings()
        self._new_request_id = new_request_id
        self.phase = Phase.REQUEST_HEADERS
        self.headers: dict[str, str] = {}
        self.request: FlowRequest | None = None
        self.usage: Usage | None = None
        self._subset: frozenset[str] | None = None
        self._ttl: float | None = None
        self._ttft_slo: float | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._request_trailers = False
        self._upstream_body = b""
        self._upstream_status: int | None = None
        self._document: dict | None = None
        self._released = False
        self._sse: SseUsageReader | None = None
        self._restorer: ModelNameRestorer | None = None
        self._response_copy: list[bytes] | None = []
        self._response_copy_size = 0
        self._held: list[bytes] | None = None
        self._response_bytes = 0
        self._first_byte_at: float | None = None
        self._last_chunk_at: float | None = None
        self._gaps: Observer | None = None

    # ---- input -------------------------------------------------------------

    def receive(self, message: ProcessingRequest, now: float) -> list[Event]:
        """Feed one message from Envoy; `now` is the caller's clock, in seconds."""
        kind = message.WhichOneof("request")
        phase = self.phase
        if phase is Phase.DONE or kind is None:
            return []
        if kind == "request_headers" and phase is Phase.REQUEST_HEADERS:
            return self._on_request_headers(message)
        if kind == "request_body" and phase is Phase.REQUEST_BODY:
            body = message.request_body
            return self._on_request_body(body.body, body.end_of_stream, now)
        if kind == "request_trailers" and phase is Phase.REQUEST_BODY:
            self._request_trailers = True
            return self._on_request_body(b"", True, now)
        if phase is Phase.UPSTREAM or phase is Phase.RESPONSE_BODY:
            if kind == "response_body":
                body = message.response_body
                return self._on_response_body(body.body, body.end_of_stream, now)
            if kind == "response_headers" and phase is Phase.UPSTREAM:
                return self._on_response_headers(message.response_headers)
            if kind == "response_trailers":
                return self._on_response_trailers()
            return []
        return self._reject(500, "protocol-error", f"unexpected {kind} in phase {phase.value}")

    def admitted(self, outcome: Outcome) -> list[Event]:
        """Feed the admission outcome for the request of `AdmissionNeeded`."""
        request = self.request
        if request is None:
            return []
        if self.phase is not Phase.ADMITTING:
            if outcome.is_dispatched:
                return self._release()
            return []
        if not outcome.is_dispatched:
            return self._reject(
                REJECTION_STATUS[outcome],
                outcome.reason,
                f"request dropped: {outcome.reason}",
                headers=((h.DROPPED_REASON, outcome.reason),),
            )
        if not request.endpoint:
            return [*self._reject(500, "internal-error", "no endpoint chosen"), *self._release()]
        return self._forward(request)

    def evict(self) -> list[Event]:
        """Flow control evicted the dispatched request: 429 with dropped
        reason `evicted` (as the reference ends it), and its release."""
        if self.phase is not Phase.UPSTREAM and self.phase is not Phase.RESPONSE_BODY:
            return []
        self._finish_usage()
        rejected = self._reject(
            429,
            "evicted",
            "request evicted by flow control",
            headers=((h.DROPPED_REASON, "evicted"),),
        )
        return [*rejected, *self._release()]

    def denied(self, reason: str) -> list[Event]:
        """An admitter refused the request before flow control: 500, as the
        reference answers an admit-plugin denial (no dropped-reason header)."""
        if self.phase is not Phase.ADMITTING:
            return []
        return self._reject(500, "admission-denied", f"request cannot be admitted: {reason}")

    def admission_failed(self) -> list[Event]:
        """The admission raised instead of returning an outcome: answer 500."""
        if self.phase is not Phase.ADMITTING:
            return []
        return self._reject(500, "internal-error", "admission failed")

    def close(self) -> list[Event]:
        """The stream ended (cleanly or not). Releases a dispatched request once."""
        if self.phase is Phase.UPSTREAM or self.phase is Phase.RESPONSE_BODY:
            return self._end_response()
        self.phase = Phase.DONE
        return []

    # ---- request path ------------------------------------------------------

    def _on_request_headers(self, message: ProcessingRequest) -> list[Event]:
        http_headers = message.request_headers
        headers, count, size = messages.read_request_headers(http_headers)
        self.headers = headers
        settings = self._settings
        if count > settings.max_header_count or size > settings.max_header_bytes:
            return self._reject(
                431,
                "request-header-fields-too-large",
                f"request headers too large: {count} headers, {size} bytes "
                f"(limits {settings.max_header_count} headers, "
                f"{settings.max_header_bytes} bytes)",
            )
        if self._settings.models is not None and _lists_models(headers):
            return self._answer_models(self._settings.models())
        if http_headers.end_of_stream:
            return self._route_bodiless()
        length = headers.get(h.CONTENT_LENGTH)
        if length is not None and length.isdigit() and int(length) > self._settings.max_body_bytes:
            return self._too_large()
        try:
            ttl = h.first(headers, h.TTL)
            self._ttl = h.parse_ttl(ttl) if ttl is not None else None
            ttft = h.first(headers, h.TTFT_SLO_MS)
            self._ttft_slo = h.parse_ttft_slo(ttft) if ttft is not None else None
        except h.BadHeader as error:
            return self._reject(400, "bad-request", f"bad request: {error}")
        subset = messages.lb_subset(message) if self._settings.honour_subset else None
        if subset is not None:
            self._subset = frozenset(address_ip(endpoint) for endpoint in subset)
        self.phase = Phase.REQUEST_BODY
        return []

    def _answer_models(self, answer: bytes | None) -> list[Event]:
        self.phase = Phase.DONE
        if answer is None:
            text = "no model data collected yet from any endpoint\n"
            return [messages.immediate_response(503, text, details="models-not-collected")]
        content_type = ((h.CONTENT_TYPE, "application/json"),)
        return [messages.immediate_response(200, answer, content_type, details="models-responder")]

    def _route_bodiless(self) -> list[Event]:
        any_endpoint = self._settings.any_endpoint
        if any_endpoint is None:
            return self._reject(400, "bad-request", "bad request: a request body is required")
        endpoint = any_endpoint()
        if endpoint is None:
            return self._reject(500, "internal-error", "no endpoint for a request without a body")
        set_headers = []
        if h.REQUEST_ID not in self.headers:
            set_headers.append((h.REQUEST_ID, self._new_request_id()))
        remove = [name for name in (*h.CONTROL_HEADERS, *h.ROUTING_HEADERS) if name in self.headers]
        self.phase = Phase.UPSTREAM
        return [messages.routed_headers_reply(endpoint, set_headers, remove)]

    def _on_request_body(self, chunk: bytes, end_of_stream: bool, now: float) -> list[Event]:
        if chunk:
            self._body_size += len(chunk)
            if self._body_size > self._settings.max_body_bytes:
                self._body.clear()
                return self._too_large()
            self._body.append(chunk)
        if not end_of_stream:
            return []
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        return self._admit(body, now)

    def _admit(self, body: bytes, now: float) -> list[Event]:
        headers = self.headers
        try:
            parsed = self._settings.parsers.parse(
                headers.get(h.PATH, ""),
                body,
                h.first(headers, h.MODEL_REWRITE),
                self._settings.default_model,
            )
        except BadRequest as error:
            return self._reject(400, "bad-request", f"bad request: {error}")
        self._upstream_body = parsed.body
        if self._settings.priority_in_body is not None:
            self._document = parsed.document
        if parsed.target_model != parsed.model:
            self._restorer = ModelNameRestorer(parsed.model, parsed.target_model)
        self.request = FlowRequest(
            request_id=headers.get(h.REQUEST_ID) or self._new_request_id(),
            fairness_id=h.first(headers, h.FAIRNESS_ID) or self._settings.default_fairness_id,
            priority=self._priority_of(headers),
            arrival=now,
            byte_size=len(body),
            input_tokens=parsed.input_tokens,
            ttl=self._ttl,
            ttft_slo=self._ttft_slo,
            payload=InferenceRequest(
                model=parsed.model,
                target_model=parsed.target_model,
                prompt=parsed.prompt,
                stream=parsed.stream,
                max_tokens=parsed.max_tokens,
                subset=self._subset,
                input_tokens=parsed.input_tokens,
                multimodal=parsed.multimodal,
                headers=headers,
                body=parsed.body,
                chat=parsed.api is Api.CHAT_COMPLETIONS,
            ),
        )
        self.phase = Phase.ADMITTING
        return [AdmissionNeeded(self.request)]

    def _forward(self, request: FlowRequest) -> list[Event]:
        payload = request.payload
        destination = payload.destination if payload is not None else None
        endpoint = destination or request.endpoint or ""  # `ip:port` (epp.api.address)
        if payload is not None and payload.fallbacks:
            # The reference's list: the destination, then the picker's fallbacks.
            endpoint = ",".join((endpoint, *payload.fallbacks))
        body = self._upstream_body
        self._upstream_body = b""
        self._upstream_status: int | None = None
        priority_in_body = self._settings.priority_in_body
        if priority_in_body is not None and self._document is not None:
            priority = priority_in_body(request)
            if priority is not None:
                body = with_priority(self._document, priority)
            self._document = None
        set_headers = [(h.CONTENT_LENGTH, str(len(body)))]
        if h.REQUEST_ID not in self.headers:
            set_headers.append((h.REQUEST_ID, request.request_id))
        remove = [name for name in h.CONTROL_HEADERS if name in self.headers]
        routing = payload.routing if payload is not None else None
        if routing:
            set_headers.extend(routing.items())
        # A client must not choose the sidecar's prefill or encode pods.
        remove.extend(
            name
            for name in h.ROUTING_HEADERS
            if name in self.headers and not (routing and name in routing)
        )
        replies: list[Event] = [messages.routed_headers_reply(endpoint, set_headers, remove)]
        replies.extend(messages.body_chunks(body, not self._request_trailers))
        if self._request_trailers:
            replies.append(messages.trailers_reply(response=False))
        self.phase = Phase.UPSTREAM
        return replies

    # ---- response path -----------------------------------------------------

    def _on_response_headers(self, http_headers: messages.HttpHeaders) -> list[Event]:
        self._upstream_status, content_type = messages.response_status_and_type(http_headers)
        if h.EVENT_STREAM in content_type:
            self._sse = SseUsageReader()
            self._response_copy = None
        elif self._restorer is not None:
            self._held = []
        payload = self.request.payload if self.request is not None else None
        # What the scheduler's plugins tell the client (the session token).
        written = payload.response_headers if payload is not None else None
        replies: list[Event] = [messages.response_headers_reply(written.items() if written else ())]
        if self.request is not None and prefiller_of(self.request) is not None:
            replies.append(PrefillDone(self.request))
        if http_headers.end_of_stream:
            self.phase = Phase.DONE
            replies.extend(self._release())
        else:
            self.phase = Phase.RESPONSE_BODY
        return replies

    def _on_response_body(self, chunk: bytes, end_of_stream: bool, now: float) -> list[Event]:
        self.phase = Phase.RESPONSE_BODY
        started: list[Event] = []
        if chunk:
            if self._first_byte_at is None:
                self._first_byte_at = now
                if self._sse is not None and self.request is not None and not end_of_stream:
                    started.append(FirstToken(self.request))
            self._response_bytes += len(chunk)
        if self._sse is not None:
            if chunk:
                self._chunk_arrived(now)
            self._sse.feed(chunk)
        else:
            self._copy_for_usage(chunk)
        if self._held is not None:
            self._held.append(chunk)
            if not end_of_stream:
                return started
            chunk = b"".join(self._held)
            self._held = None
        if self._restorer is not None:
            chunk = self._restorer.restore(chunk)
        if len(chunk) > messages.CHUNK_BYTES:
            replies: list[Event] = list(messages.body_chunks(chunk, end_of_stream, response=True))
        else:
            replies = [messages.response_body_reply(chunk, end_of_stream)]
        replies.extend(started)
        if end_of_stream:
            replies.extend(self._end_response())
        return replies

    def _chunk_arrived(self, now: float) -> None:
        last = self._last_chunk_at
        self._last_chunk_at = now
        if last is None:
            return
        gaps = self._gaps
        if gaps is None:
            chunk_gaps = self._settings.chunk_gaps
            if chunk_gaps is None or self.request is None:
                return
            gaps = self._gaps = chunk_gaps(self.request)
        gaps.add(now - last)

    def _on_response_trailers(self) -> list[Event]:
        replies: list[Event] = []
        if self._held:
            body = b"".join(self._held)
            if self._restorer is not None:
                body = self._restorer.restore(body)
            replies.extend(messages.body_chunks(body, False, response=True))
        self._held = None
        replies.append(messages.trailers_reply(response=True))
        replies.extend(self._end_response())
        return replies

    def _copy_for_usage(self, chunk: bytes) -> None:
        copy = self._response_copy
        if copy is None:
            return
        self._response_copy_size += len(chunk)
        if self._response_copy_size > self._settings.max_body_bytes:
            self._response_copy = None
        else:
            copy.append(chunk)

    def _finish_usage(self) -> None:
        if self.usage is not None:
            return
        if self._sse is not None:
            self._sse.finish()
            self.usage = self._sse.usage
        elif self._response_copy:
            self.usage = usage_from_json(b"".join(self._response_copy))
            self._response_copy = None

    # ---- endings -----------------------------------------------------------

    def _end_response(self) -> list[Event]:
        """The call is over after it reached the upstream: the usage its
        response carried is read first, since the release reports it."""
        self.phase = Phase.DONE
        self._finish_usage()
        return self._release()

    def _release(self) -> list[Event]:
        if self._released or self.request is None:
            return []
        self._released = True
        return [
            Release(
                self.request,
                self.usage,
                self._response_bytes,
                self._first_byte_at,
                self._sse is not None,
                self._upstream_status,
            )
        ]

    def _too_large(self) -> list[Event]:
        limit = self._settings.max_body_bytes
        return self._reject(413, "request-too-large", f"request body larger than {limit} bytes")

    def _reject(
        self,
        status: int,
        reason: str,
        text: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> list[Event]:
        self.phase = Phase.DONE
        self._body = []
        reply = messages.immediate_response(status, text + "\n", headers, details=reason)
        return [reply, Rejected(status, reason, self.request)]
