"""The framed protocol between the core owner and its protocol workers
(`epp serve --workers N`; docs/operations/workers.md).

A frame is a 4-byte big-endian length, then an orjson array of messages:
everything one side has to say in one turn of its event loop goes out as
one frame. Each message is an array whose first item is its kind.

Worker -> owner (`rid` numbers a request on its worker's link):

    ARRIVE       rid + the request's scheduling inputs (`arrival_fields`)
    COMPLETE     rid, input tokens (null: no usage reported), output tokens, itl
    FIRST_TOKEN  rid
    PREFILL_DONE rid
    CANCEL       rid (the stream went away before a decision came)
    REJECTED     rid (the worker is done with an undispatched request the
                 owner knows: a local error reply, or its stream gone after
                 a decision that did not dispatch it)
    SERIES       the answered PULL's number or null, then what the worker's
                 stream-side and outcome series gathered since its last SERIES
                 (`epp.serve.metrics.shipping`): sent each second when
                 something changed, and in answer to a PULL
    SERVING      the worker is ready for connections (its first message)
    METRICS      address + one read of its metrics page (`metrics_fields`)
    FRESH        address, the read's time: a read of its page equal to the
                 last METRICS sent for it apart from its time
    SCRAPE_FAILED address, the failure's reason (a read of its page failed)
    TRANSPORT    open connections, limit trips by name (cumulative for this
                 process), when either changed (looked at each second)
    TOKENIZED    requests the token producer tokenized, and left with the
                 estimate by reason, since the last TOKENIZED; its caches'
                 [entries, capacity, dropped] by name (cumulative for this
                 process); sent before a SERIES, when any changed

Owner -> worker:

    DECISION     rid, outcome value (null: admission failed), endpoint,
                 destination, fallbacks, routing, response headers, priority,
                 the forwarded body's priority (null unless propagated), and
                 when the worker records the outcome series, their fields
                 (`RequestMetrics.outcome_fields`); a CANCEL that crossed
                 such a DECISION has the owner record them
    DENIED       rid, the admitter's reason, priority
    EVICT        rid
    ENDPOINTS    the pool's addresses (requests without a body go to one)
    READY        a health service and its status
    GEOMETRY     block characters and blocks per prompt of the prefix scorer:
                 the worker hashes prompts with it (a request hashed with a
                 geometry the scorer no longer uses is hashed again there)
    SCRAPE       the endpoints whose metrics this worker reads, as
                 [name, address, labels, id] each (all of its share)
    PULL         a number: send SERIES now (the owner's page is being read)
    MODELS       the models-responder's `GET /v1/models` answer (JSON text;
                 null while no endpoint reported its list), when it changed

Times are `time.monotonic()` seconds, one clock for every process of a host.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import orjson

from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.endpoint import EndpointMetrics
from epp.scheduling.request import InferenceRequest

# worker -> owner
ARRIVE = 1
COMPLETE = 2
FIRST_TOKEN = 3
PREFILL_DONE = 4
CANCEL = 5
REJECTED = 6
SERIES = 7
SERVING = 8
METRICS = 9
SCRAPE_FAILED = 10
# owner -> worker
DECISION = 11
DENIED = 12
EVICT = 13
ENDPOINTS = 14
READY = 15
GEOMETRY = 16
SCRAPE = 17
TRANSPORT = 18  # worker -> owner
PULL = 19  # owner -> worker
MODELS = 20  # owner -> worker
TOKENIZED = 21  # worker -> owner
FRESH = 22  # worker -> owner

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024
"""A frame larger than this ends the link: a request's fields are bounded by
the body limit (16 MiB by default), and a frame holds one turn's messages."""

Message = list[Any]


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def arrival_fields(request: FlowRequest) -> Message:
    """The scheduling inputs of a request the stream machine built, as the
    owner rebuilds it (`request_from_fields`). The priority is not among
    them: the owner holds the objectives and resolves it from the headers.
    Of a tokenized prompt's tokens only their count and block keys (the
    precise prefix cache's lookup) cross, not the token ids."""
    payload: InferenceRequest = request.payload
    return [
        request.request_id,
        request.fairness_id,
        request.arrival,
        request.byte_size,
        request.input_tokens,
        request.ttl,
        request.ttft_slo,
        payload.model,
        payload.target_model,
        payload.prompt,
        payload.stream,
        payload.max_tokens,
        sorted(payload.subset) if payload.subset is not None else None,
        payload.multimodal,
        payload.headers,
        payload.prefix_hashes,
        payload.kv_block_keys,
    ]


def request_from_fields(fields: Message, priority: Callable[[dict[str, str]], int]) -> FlowRequest:
    """The request `arrival_fields` describes, its priority from `priority`."""
    (
        request_id,
        fairness_id,
        arrival,
        byte_size,
        input_tokens,
        ttl,
        ttft_slo,
        model,
        target_model,
        prompt,
        stream,
        max_tokens,
        subset,
        multimodal,
        headers,
        hashes,
        kv_block_keys,
    ) = fields
    return FlowRequest(
        request_id=request_id,
        fairness_id=fairness_id,
        priority=priority(headers),
        arrival=arrival,
        byte_size=byte_size,
        input_tokens=input_tokens,
        ttl=ttl,
        ttft_slo=ttft_slo,
        payload=InferenceRequest(
            model=model,
            target_model=target_model,
            prompt=prompt,
            stream=stream,
            max_tokens=max_tokens,
            subset=frozenset(subset) if subset is not None else None,
            input_tokens=input_tokens,
            multimodal=multimodal,
            headers=headers,
            prefix_hashes=(hashes[0], hashes[1], tuple(hashes[2])) if hashes else None,
            kv_block_keys=tuple(kv_block_keys) if kv_block_keys is not None else None,
        ),
    )


def decision_fields(
    request: FlowRequest, priority_in_body: Callable[[FlowRequest], int | None] | None = None
) -> Message:
    """What the scheduler wrote on a decided request that its reply needs,
    the priority its metrics are labelled with, and, with `priority_in_body`
    (`requestHandler.propagatePriority`), its forwarded body's priority."""
    outcome = request.outcome
    payload: InferenceRequest | None = request.payload
    if payload is None or outcome is None or not outcome.is_dispatched:
        value = outcome.value if outcome is not None else None
        return [value, None, None, None, None, None, request.priority, None]
    return [
        outcome.value,
        request.endpoint,
        payload.destination,
        payload.fallbacks,
        payload.routing,
        payload.response_headers,
        request.priority,
        priority_in_body(request) if priority_in_body is not None else None,
    ]


def usage_fields(usage: Usage | None) -> Message:
    """A completion's usage as COMPLETE carries it: the flow-control part
    (input and output tokens; the cached tokens are the worker's metrics')."""
    return [None, 0] if usage is None else [usage.input_tokens, usage.output_tokens]


def usage_from(input_tokens: int | None, output_tokens: int) -> Usage | None:
    """The usage `usage_fields` sent."""
    return None if input_tokens is None else Usage(input_tokens, output_tokens)


def metrics_fields(metrics: EndpointMetrics) -> Message:
    """One read's values in `EndpointMetrics` order, the LoRA sets as lists."""
    return [
        metrics.waiting,
        metrics.running,
        metrics.kv_usage,
        list(metrics.lora_running),
        list(metrics.lora_waiting),
        *metrics[5:],
    ]


def metrics_from_fields(fields: Message) -> EndpointMetrics:
    """The read `metrics_fields` describes, its JSON arrays made sets and
    tuples again (the field order is `EndpointMetrics`' own)."""
    read = EndpointMetrics._make(fields)
    return read._replace(
        lora_running=frozenset(read.lora_running),
        lora_waiting=frozenset(read.lora_waiting),
        itl_bounds=tuple(read.itl_bounds),
        itl_buckets=tuple(read.itl_buckets),
    )


class TurnOutbox:
    """`send` queues a message; what one turn of the loop queued leaves
    together at the end of that turn, through `_write`. Nothing is queued
    once `closed` is set."""

    def __init__(self) -> None:
        self._outbox: list[Message] = []
        self._flush_armed = False
        self.closed = False

    def send(self, message: Message) -> None:
        if self.closed:
            return
        self._outbox.append(message)
        if not self._flush_armed:
            self._flush_armed = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_armed = False
        outbox, self._outbox = self._outbox, []
        if outbox and not self.closed:
            self._write(outbox)

    def _write(self, outbox: list[Message]) -> None:
        raise NotImplementedError


class Link(TurnOutbox, asyncio.Protocol):
    """One end of a local socket carrying frames. `send` queues a message;
    the queue goes out as one frame at the end of the loop's turn.
    `on_messages` gets each received frame's messages; `on_lost` is called
    once when the peer is gone (or sent a bad frame)."""

    def __init__(
        self,
        on_messages: Callable[[list[Message]], None],
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__()
        self._on_messages = on_messages
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._inbox = bytearray()
        self.frames_in = 0
        self.frames_out = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def _write(self, outbox: list[Message]) -> None:
        if self._transport is None:
            return
        body = orjson.dumps(outbox)
        self._transport.write(HEADER.pack(len(body)) + body)
        self.frames_out += 1

    def data_received(self, data: bytes) -> None:
        inbox = self._inbox
        inbox += data
        start = 0
        size = len(inbox)
        while size - start >= 4:
            (length,) = HEADER.unpack_from(inbox, start)
            if length > MAX_FRAME_BYTES:
                self._fail()
                return
            end = start + 4 + length
            if end > size:
                break
            try:
                messages = orjson.loads(memoryview(inbox)[start + 4 : end])
            except orjson.JSONDecodeError:
                self._fail()
                return
            start = end
            self.frames_in += 1
            self._on_messages(messages)
            if self.closed:
                return
        if start:
            del inbox[:start]

    def _fail(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.connection_lost(FrameError("bad frame"))

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._inbox.clear()
        self._on_lost()
