"""Every limit of the gRPC transport, with its default, in one place.

`epp serve` sets the ext_proc port's from its flags and the flow-control
capacity, and serves health with `HEALTH_LIMITS`. `docs/operations/transport-limits.md`
lists each default next to grpc-go's and Envoy's.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field, fields, replace
from typing import Any

KIB = 1024
MIB = 1024 * 1024


def limit(default: Any, description: str) -> Any:
    """A TransportLimits field: its default and what it limits (its flag's help)."""
    return field(default=default, metadata={"description": description})


@dataclass(slots=True, frozen=True)
class TransportLimits:
    """What one GrpcServer allows each client. Sizes in bytes, times in seconds."""

    max_receive_message_bytes: int = limit(
        4 * MIB,
        "A larger inbound message ends its call with RESOURCE_EXHAUSTED (grpc-go: 4 MiB).",
    )
    max_send_message_bytes: int = limit(
        2**31 - 1,
        "A larger outbound message ends its call with RESOURCE_EXHAUSTED (grpc-go: 2 GiB).",
    )
    max_concurrent_streams: int = limit(
        65_536,
        "Advertised; a stream over it is refused (REFUSED_STREAM). Every queued "
        "request holds one, so `epp serve` raises it to the flow-control capacity.",
    )
    max_header_list_bytes: int = limit(
        16 * KIB,
        "Advertised; also caps a header block's raw size across CONTINUATION frames.",
    )
    stream_window_bytes: int = limit(
        1 * MIB,
        "Inbound flow-control window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).",
    )
    connection_window_bytes: int = limit(
        4 * MIB,
        "Inbound flow-control window of the connection: what a client may send that "
        "the server has not yet acknowledged.",
    )
    connection_buffer_bytes: int = limit(
        8 * MIB,
        "Bytes a connection may hold (partial inbound messages plus unsent replies); "
        "above it, received DATA is not acknowledged until it drains.",
    )
    max_call_outbox_bytes: int = limit(
        8 * MIB,
        "Unsent replies one call may hold; above it the call is reset (RST_STREAM "
        "ENHANCE_YOUR_CALM) and its handler cancelled.",
    )
    premature_reset_min_streams: int = limit(
        500,
        "Streams a connection must have closed before its reset ratio counts.",
    )
    premature_reset_ratio: float = limit(
        0.5,
        "Above this share of streams reset by the client before their first message "
        "was delivered: GOAWAY ENHANCE_YOUR_CALM and close (rapid reset).",
    )
    max_control_frames_per_second: int = limit(
        1_000,
        "PING, SETTINGS, PRIORITY, WINDOW_UPDATE and empty DATA frames a client may "
        "send per second; above: GOAWAY ENHANCE_YOUR_CALM and close.",
    )
    min_ping_interval: float = limit(
        10.0,
        "A client PING sooner than this after its previous one, with no data or "
        "headers sent in between, is a strike.",
    )
    max_ping_strikes: int = limit(
        2,
        "Above this many strikes: GOAWAY ENHANCE_YOUR_CALM and close (grpc-go's policy).",
    )
    handshake_timeout: float = limit(
        10.0,
        "A connection that has not sent its preface and acknowledged the server's "
        "SETTINGS by then is closed (TLS handshakes have the same).",
    )
    idle_timeout: float = limit(
        3600.0,
        "A connection without open calls for this long gets GOAWAY and is closed.",
    )
    keepalive_time: float = limit(
        60.0,
        "After this long without a frame from the client the server PINGs it.",
    )
    keepalive_timeout: float = limit(
        20.0,
        "A keepalive PING not answered in this time closes the connection.",
    )
    max_connections: int = limit(
        1_024,
        "Connections held at once (kept below the process's file limit, see "
        "`effective_max_connections`); more are closed as soon as accepted.",
    )
    max_new_streams_per_turn: int = limit(
        64,
        "New streams a connection handles before it yields the event loop to the "
        "other connections (the rest of its read waits for the next turn).",
    )
    max_frames_per_turn: int = limit(
        128,
        "Frames a connection hands to h2 before it yields the event loop likewise.",
    )
    max_bytes_per_turn: int = limit(
        64 * KIB,
        "Bytes after which a connection starts no new frame in the event loop's turn.",
    )

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) <= 0:
                raise ValueError(f"transport limit {name} must be positive")
        if self.stream_window_bytes > 2**31 - 1 or self.connection_window_bytes > 2**31 - 1:
            raise ValueError("HTTP/2 flow-control windows are at most 2**31-1 bytes")

    @staticmethod
    def description(name: str) -> str:
        """What the field `name` limits."""
        return next(f.metadata["description"] for f in fields(TransportLimits) if f.name == name)

    def sized_for(self, *, queued_requests: int, reply_bytes: int) -> TransportLimits:
        """These limits with room for `queued_requests` open streams and for
        one call's `reply_bytes` of queued replies (a whole request body
        sent back at once)."""
        return replace(
            self,
            max_concurrent_streams=max(self.max_concurrent_streams, queued_requests),
            max_call_outbox_bytes=max(self.max_call_outbox_bytes, reply_bytes),
            connection_buffer_bytes=max(self.connection_buffer_bytes, reply_bytes),
        )


HEALTH_LIMITS = TransportLimits(
    max_receive_message_bytes=4 * KIB,
    max_concurrent_streams=16,
    max_header_list_bytes=8 * KIB,
    stream_window_bytes=64 * KIB,
    connection_window_bytes=256 * KIB,
    connection_buffer_bytes=256 * KIB,
    max_call_outbox_bytes=64 * KIB,
    max_connections=64,
)
"""The health port's: a few probes at a time, each a few bytes each way."""

FD_RESERVE = 256
"""File descriptors left for everything but the ext_proc port's connections
(the health and metrics ports, scrapes of the model servers, files)."""


def effective_max_connections(limit: int) -> int:
    """`limit`, lowered to keep `FD_RESERVE` descriptors free under the
    process's soft RLIMIT_NOFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(1, min(limit, soft - FD_RESERVE))
