"""The abuse limits of one HTTP/2 connection, counted as its frames come
and go (no I/O): too many control frames in a second, PINGs against
grpc-go's ping policy, and a high share of streams reset before their first
message (rapid reset). Each check answers whether the connection must end;
the connection then sends GOAWAY ENHANCE_YOUR_CALM naming the limit."""

from __future__ import annotations

import time

from epp.transport.limits import TransportLimits

WINDOW_UPDATES_PER_DATA_FRAME = 10
"""WINDOW_UPDATEs per DATA frame sent that are not counted as control
frames (Envoy's max_inbound_window_update_frames_per_data_frame_sent)."""


class Guards:
    """One connection's abuse counters against `limits`."""

    __slots__ = (
        "_control_frames",
        "_control_window_start",
        "_last_ping",
        "_limits",
        "_ping_strikes",
        "_premature_resets",
        "_streams_opened",
        "_window_update_credit",
        "sent_since_ping",
    )

    def __init__(self, limits: TransportLimits) -> None:
        self._limits = limits
        self._streams_opened = 0
        self._premature_resets = 0
        self._control_frames = 0
        self._control_window_start = 0.0
        self._window_update_credit = 0
        """WINDOW_UPDATEs the client may send before they count as control
        frames: a few for each DATA frame sent (as Envoy allows)."""
        self._ping_strikes = 0
        self._last_ping = -float("inf")
        self.sent_since_ping = True
        """Headers or data went out since the client's last PING."""

    def control_frame(self) -> bool:
        """Count a control frame: True when more than the limit came within a second."""
        self._control_frames += 1
        if self._control_frames > self._limits.max_control_frames_per_second:
            now = time.monotonic()
            if now - self._control_window_start < 1.0:
                return True
            self._control_frames = 1
            self._control_window_start = now
        return False

    def window_update(self) -> bool:
        """A WINDOW_UPDATE: free while DATA sent earned it credit, else a control frame."""
        if self._window_update_credit > 0:
            self._window_update_credit -= 1
            return False
        return self.control_frame()

    def data_frame_sent(self) -> None:
        self._window_update_credit += WINDOW_UPDATES_PER_DATA_FRAME
        self.sent_since_ping = True

    def ping_strikes_out(self) -> bool:
        """A PING (a control frame counted apart): True when it is one strike
        too many (within `min_ping_interval` of the last, nothing sent between)."""
        limits = self._limits
        now = time.monotonic()
        if not self.sent_since_ping and now - self._last_ping < limits.min_ping_interval:
            self._ping_strikes += 1
            if self._ping_strikes > limits.max_ping_strikes:
                return True
        self._last_ping = now
        self.sent_since_ping = False
        return False

    def stream_opened(self) -> None:
        self._streams_opened += 1

    def too_many_premature_resets(self) -> bool:
        """A stream reset by the client before its first message: True when
        such resets are over `premature_reset_ratio` of the streams opened."""
        self._premature_resets += 1
        limits = self._limits
        return (
            self._streams_opened >= limits.premature_reset_min_streams
            and self._premature_resets > limits.premature_reset_ratio * self._streams_opened
        )
