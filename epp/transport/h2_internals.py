"""Every use of h2's and hpack's private internals, in one place.

h2 is used through its public API everywhere else in epp.transport. What is
here changes h2 where its public API cannot, for a server that holds
thousands of streams and faces clients it does not trust; each change is
checked against h2's own behaviour in tests/unit/transport. Upgrading h2
means reading this file against h2's `connection.py` and `frame_buffer.py`.

- `ServerH2Connection` counts open streams without walking the stream table
  for every new stream; refuses a stream over MAX_CONCURRENT_STREAMS with
  RST_STREAM REFUSED_STREAM instead of tearing the connection down; keeps
  the connection open after the client's GOAWAY; skips h2's per-frame trace
  formatting; and uses the two coders and the frame buffer below.
- `ServerH2Connection.receive_data` caps a header block's raw size across
  CONTINUATION frames (h2 caps only their number, 64, each up to the frame
  size), checked once per call: a block may pass the cap by at most the
  data of one call before it is refused.
- `RepeatedBlockDecoder` / `RepeatedBlockEncoder` remember small header
  blocks that leave the coder's state as they found it; the decoder also
  refuses a block with more than two dynamic table size updates.
- `LazyWindowStream` keeps its send window as a distance from the peer's
  SETTINGS_INITIAL_WINDOW_SIZE, held once in the connection's
  `SendWindows`, and reads SETTINGS_MAX_FRAME_SIZE from there too: a
  SETTINGS frame changing either costs O(1) (O(log n) amortized to check
  that no window passes 2^31-1), where h2 walks every stream.
- `header_list_error` validates inbound header lists (RFC 9113 §8.2 and
  §8.3.1) in place of h2's validation, remembering the lists it passed:
  h2's generator chain costs about a third of a request's transport CPU,
  and Envoy sends the same list on every stream. A malformed request is a
  stream error (RST_STREAM PROTOCOL_ERROR, RFC 9113 §8.1.1), where h2's
  would end the whole connection.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Hashable, Iterable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import hpack
import hpack.exceptions
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame

STREAM_WALK_SLACK = 64
MAX_WINDOW = 2**31 - 1
"""RFC 9113 §6.9.1: the largest a flow-control window may be."""
CREDIT_HEAP_SLACK = 64
MEMO_MAX_BLOCK_BYTES = 1024
"""Only header blocks up to this size are remembered: Envoy's repeat, and a
large block would make the memo a store of attacker data."""
MAX_TABLE_SIZE_UPDATES = 2
"""RFC 7541 §4.2: a block starts with at most two size updates (the
smallest size since the last block, then the final one)."""


class StateMemo:
    """Results of a header coder, each valid while the coder is in the state
    it was computed in. Only results whose computation left that state
    unchanged are kept (a coding that changed it would change it again)."""

    SIZE = 64

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[tuple, object]] = {}

    def get(self, key: Hashable, state: tuple) -> object | None:
        entry = self._entries.get(key)
        return entry[1] if entry is not None and entry[0] == state else None

    def keep(self, key: Hashable, before: tuple, after: tuple, result: object) -> None:
        if before != after:
            return
        if len(self._entries) >= self.SIZE:
            self._entries.clear()
        self._entries[key] = (before, result)


def table_size_updates(block: bytes) -> int:
    """How many dynamic table size updates open `block` (RFC 7541 §6.3: each
    is `001` and a 5-bit-prefix integer)."""
    count = 0
    position = 0
    while position < len(block) and block[position] & 0xE0 == 0x20:
        count += 1
        if count > MAX_TABLE_SIZE_UPDATES:
            return count
        _, consumed = hpack.hpack.decode_integer(block[position:], 5)
        position += consumed
    return count


class RepeatedBlockDecoder(hpack.Decoder):
    """hpack's decoder, remembering the small header blocks that leave its
    state as they found it.

    Envoy opens every ext_proc stream with the same header block, whose
    `:path` is a Huffman-coded literal that hpack decodes bit by bit in Python
    (~6% of the server's CPU per request). What a block decodes to depends
    only on the block and the decoder's state (its dynamic table and size
    limits), so a block that changed none of that decodes to the same headers
    whenever the state is the same again."""

    def __init__(self) -> None:
        super().__init__()
        self._memo = StateMemo()

    def _state(self) -> tuple:
        return (
            tuple(self.header_table.dynamic_entries),
            self.header_table_size,
            self.max_allowed_table_size,
            self.max_header_list_size,
        )

    def decode(self, data: bytes, raw: bool = False) -> list:
        if table_size_updates(data) > MAX_TABLE_SIZE_UPDATES:
            raise hpack.exceptions.HPACKDecodingError("more than two table size updates")
        if len(data) > MEMO_MAX_BLOCK_BYTES:
            return list(super().decode(data, raw))
        key = (bytes(data), raw)
        state = self._state()
        headers = self._memo.get(key, state)
        if headers is None:
            headers = list(super().decode(data, raw))
            self._memo.keep(key, state, self._state(), headers)
        return list(headers)


class RepeatedBlockEncoder(hpack.Encoder):
    """hpack's encoder, remembering the header lists whose encoding leaves its
    state as it found it: every call sends the same response headers and,
    mostly, the same trailers, which hpack would look up in its tables field
    by field each time. Only lists of plain tuples are remembered (a
    `HeaderTuple` carries its indexing in its type)."""

    def __init__(self) -> None:
        super().__init__()
        self._memo = StateMemo()

    def _state(self) -> tuple:
        table = self.header_table
        return (tuple(table.dynamic_entries), table.maxsize, table.resized)

    def encode(self, headers: Iterable | dict, huffman: bool = True) -> bytes:
        if isinstance(headers, dict):
            return super().encode(headers, huffman)
        headers = tuple(headers)
        if any(type(header) is not tuple for header in headers):
            return super().encode(headers, huffman)
        key = (headers, huffman)
        state = self._state()
        block = self._memo.get(key, state)
        if block is None:
            block = super().encode(headers, huffman)
            self._memo.keep(key, state, self._state(), block)
        return block


REQUEST_PSEUDO_HEADERS = frozenset((b":method", b":scheme", b":path", b":authority", b":protocol"))
CONNECTION_FIELDS = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
INVALID_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9a-z]")
"""Anything but a lowercase token character (RFC 9110 §5.1, RFC 9113 §8.2.1)."""
INVALID_VALUE = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")
VALID_LISTS_KEPT = 64
_valid_lists: tuple[dict[tuple, None], dict[tuple, None]] = ({}, {})
"""Well-formed request header lists, and well-formed trailer lists."""


def header_list_error(headers: list, *, trailers: bool) -> str | None:
    """Why `headers` (request headers, or trailers) is malformed; None when
    it is well-formed. Well-formed lists are remembered."""
    key = tuple(headers)
    valid = _valid_lists[trailers]
    if key in valid:
        return None
    error = _header_list_error(headers, trailers)
    if error is None:
        if len(valid) >= VALID_LISTS_KEPT:
            valid.clear()
        valid[key] = None
    return error


def _header_list_error(headers: list, trailers: bool) -> str | None:
    pseudo: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if trailers or regular:
                return "a pseudo-header in trailers or after a regular field"
            if name not in REQUEST_PSEUDO_HEADERS or name in pseudo:
                return "an unknown or repeated pseudo-header"
            pseudo.add(name)
        else:
            regular = True
            if not name or INVALID_NAME.search(name):
                return "an invalid field name"
            if name in CONNECTION_FIELDS or (name == b"te" and value != b"trailers"):
                return "a connection-specific field"
        if INVALID_VALUE.search(value):
            return "an invalid field value"
    if trailers:
        return None
    if not {b":method", b":scheme", b":path"} <= pseudo:
        return "a request without :method, :scheme and :path"
    if any(name == b":path" and not value for name, value in headers):
        return "an empty :path"
    if b":authority" in pseudo:
        authority = next(value for name, value in headers if name == b":authority")
        # RFC 9113 §8.3.1: a Host that names another entity than :authority.
        if any(name == b"host" and value != authority for name, value in headers):
            return "a host field that differs from :authority"
    return None


class SendWindows:
    """The send side of a connection's streams, held once for all of them:
    the peer's SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_FRAME_SIZE, and
    the streams whose window is above the initial window.

    RFC 9113 §6.9.2 moves every stream's window by a change of the initial
    window, so a stream's `credit` (its window minus the initial window) does
    not change with it: a window is `credit + initial`, and a change of the
    setting is one assignment. The change is a connection error when it
    lifts some window past 2^31-1, that is when the largest credit plus the
    new initial window is past it; only a positive credit can be (the
    setting itself is at most 2^31-1), and `largest_credit` finds the
    largest of those in a heap with lazy deletion.

    Invariants: `credits` holds the current credit of every stream whose
    credit is positive (and maybe of streams since closed); every entry of
    `credits` has an entry (-credit, stream id) in `heap`, which may also
    hold stale entries; `heap` has at most twice the entries it had after
    its last rebuild, plus `CREDIT_HEAP_SLACK`.
    """

    __slots__ = ("_kept", "credits", "heap", "initial", "max_frame_size", "streams")

    def __init__(self, streams: dict[int, h2.stream.H2Stream], settings: h2.settings.Settings):
        self.streams = streams
        self.initial: int = settings.initial_window_size
        self.max_frame_size: int = settings.max_frame_size
        self.credits: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []
        self._kept = 0

    def set_credit(self, stream_id: int, credit: int) -> None:
        if credit > 0:
            self.credits[stream_id] = credit
            heapq.heappush(self.heap, (-credit, stream_id))
            if len(self.heap) > 2 * self._kept + CREDIT_HEAP_SLACK:
                self._rebuild()
        elif stream_id in self.credits:
            del self.credits[stream_id]

    def _live(self, stream_id: int) -> bool:
        stream = self.streams.get(stream_id)
        return stream is not None and not stream.closed

    def _rebuild(self) -> None:
        """One entry per open stream with a positive credit."""
        self.credits = {sid: c for sid, c in self.credits.items() if self._live(sid)}
        self.heap = [(-credit, stream_id) for stream_id, credit in self.credits.items()]
        heapq.heapify(self.heap)
        self._kept = len(self.heap)

    def largest_credit(self) -> int:
        """The largest credit of an open stream, 0 if none is positive."""
        heap, credits = self.heap, self.credits
        while heap:
            negated, stream_id = heap[0]
            if credits.get(stream_id) == -negated:
                if self._live(stream_id):
                    return -negated
                del credits[stream_id]
            heapq.heappop(heap)
        return 0


class LazyWindowStream(h2.stream.H2Stream):
    """h2's stream, its send window kept as a credit against the
    connection's `SendWindows` (see there), and its largest frame read from
    it: h2 reads and writes `outbound_flow_control_window` and
    `max_outbound_frame_size` as attributes, so both are properties here."""

    def __init__(
        self,
        stream_id: int,
        config: h2.config.H2Configuration,
        inbound_window_size: int,
        windows: SendWindows,
    ) -> None:
        self._windows = windows
        self._credit = 0
        super().__init__(stream_id, config, inbound_window_size, windows.initial)

    @property
    def outbound_flow_control_window(self) -> int:
        return self._credit + self._windows.initial

    @outbound_flow_control_window.setter
    def outbound_flow_control_window(self, window: int) -> None:
        windows = self._windows
        credit = self._credit = window - windows.initial
        if credit > 0 or windows.credits:
            windows.set_credit(self.stream_id, credit)

    @property
    def max_outbound_frame_size(self) -> int:
        return self._windows.max_frame_size

    @max_outbound_frame_size.setter
    def max_outbound_frame_size(self, size: int | None) -> None:
        """Ignored: the connection's value is every stream's."""


class ServerH2Connection(h2.connection.H2Connection):
    """h2's server connection for many streams and untrusted clients (see the
    module docstring).

    Counting the open streams, which h2 does for each new stream by walking
    all of them (and dropping the closed ones), is done only when the stream
    table has doubled since the last walk or could have reached the limit;
    in between the table's size stands for the count (an upper bound).
    """

    def __init__(
        self,
        config: h2.config.H2Configuration,
        *,
        max_streams: int = 2**31 - 1,
        max_header_list_bytes: int = h2.connection.H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE,
    ) -> None:
        super().__init__(config)
        self._streams_after_walk = 0
        self.max_streams = max_streams
        self.refused_streams = 0
        self.malformed_requests = 0
        self.encoder = RepeatedBlockEncoder()
        self.decoder = RepeatedBlockDecoder()
        self.decoder.max_header_list_size = max_header_list_bytes
        self.max_header_block_bytes = max_header_list_bytes
        self.send_windows = SendWindows(self.streams, self.remote_settings)

    def receive_data(self, data: bytes | memoryview) -> list[h2.events.Event]:
        events = super().receive_data(data)
        held = self.incoming_buffer._headers_buffer
        if held and sum(len(frame.data) for frame in held) > self.max_header_block_bytes:
            self._terminate_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            raise h2.exceptions.DenialOfServiceError(
                f"header block over {self.max_header_block_bytes} bytes"
            )
        return events

    @property
    def open_inbound_streams(self) -> int:
        size = len(self.streams)
        if size < 2 * self._streams_after_walk + STREAM_WALK_SLACK and size < self.max_streams:
            return size
        count = super().open_inbound_streams
        self._streams_after_walk = len(self.streams)
        return count

    def _begin_new_stream(
        self, stream_id: int, allowed_ids: h2.connection.AllowedStreamIDs
    ) -> h2.stream.H2Stream:
        """h2's, with a `LazyWindowStream` (less its debug log lines)."""
        outbound = self._stream_id_is_outbound(stream_id)
        highest = self.highest_outbound_stream_id if outbound else self.highest_inbound_stream_id
        if stream_id <= highest:
            raise h2.exceptions.StreamIDTooLowError(stream_id, highest)
        if (stream_id % 2) != int(allowed_ids):
            raise h2.exceptions.ProtocolError("Invalid stream ID for peer.")
        stream = LazyWindowStream(
            stream_id, self.config, self.local_settings.initial_window_size, self.send_windows
        )
        self.streams[stream_id] = stream
        if outbound:
            self.highest_outbound_stream_id = stream_id
        else:
            self.highest_inbound_stream_id = stream_id
        return stream

    def _acknowledge_settings(self) -> list[Frame]:
        """h2's, with the changes of the initial window and the frame size
        made once in `SendWindows` instead of on every stream."""
        self.state_machine.process_input(h2.connection.ConnectionInputs.SEND_SETTINGS)
        changes = self.remote_settings.acknowledge()
        codes = h2.settings.SettingCodes
        windows = self.send_windows
        if codes.INITIAL_WINDOW_SIZE in changes:
            initial = changes[codes.INITIAL_WINDOW_SIZE].new_value
            if initial > windows.initial and windows.largest_credit() + initial > MAX_WINDOW:
                raise h2.exceptions.FlowControlError(
                    f"May not increment flow control window past {MAX_WINDOW}"
                )
            windows.initial = initial
        if codes.HEADER_TABLE_SIZE in changes:
            self.encoder.header_table_size = changes[codes.HEADER_TABLE_SIZE].new_value
        if codes.MAX_FRAME_SIZE in changes:
            size = changes[codes.MAX_FRAME_SIZE].new_value
            self.max_outbound_frame_size = windows.max_frame_size = size
        ack = SettingsFrame(0)
        ack.flags.add("ACK")
        return [ack]

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list, list]:
        """A new stream over the limit is refused (RFC 9113 §5.1.2: a stream
        error, REFUSED_STREAM, so the client may retry it); its header block
        is still decoded, to keep the HPACK state in step (§4.3)."""
        stream_id = frame.stream_id
        if (
            stream_id not in self.streams
            and stream_id % 2 == 1
            and stream_id > self.highest_inbound_stream_id
            and self.open_inbound_streams >= self.max_streams
        ):
            list(h2.connection._decode_headers(self.decoder, frame.data))
            self.highest_inbound_stream_id = stream_id
            self._closed_streams[stream_id] = h2.stream.StreamClosedBy.SEND_RST_STREAM
            reset = RstStreamFrame(stream_id)
            reset.error_code = h2.errors.ErrorCodes.REFUSED_STREAM
            self.refused_streams += 1
            return [reset], []
        frames, events = super()._receive_headers_frame(frame)
        for event in events:
            kind = type(event)
            if kind is h2.events.RequestReceived or kind is h2.events.TrailersReceived:
                error = header_list_error(
                    event.headers, trailers=kind is h2.events.TrailersReceived
                )
                if error is not None:
                    self.malformed_requests += 1
                    self.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
                    return frames, []
        return frames, events

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        """h2's own, less its trace log of `repr(frame)`, which it formats for
        every frame received even when nothing logs it: ~8% of the server's
        CPU per ext_proc request (6 frames in, each a hex dump). The error
        handling is h2's (4.x), line for line."""
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as error:
            if not self._stream_is_closed_by_reset(error.stream_id):
                raise
            reset = RstStreamFrame(error.stream_id)
            reset.error_code = error.error_code
            self._prepare_for_sending([reset])
            return error._events
        except h2.exceptions.StreamIDTooLowError as error:
            if self._stream_is_closed_by_reset(error.stream_id):
                reset = RstStreamFrame(error.stream_id)
                reset.error_code = h2.errors.ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([reset])
                return []
            if self._stream_is_closed_by_end(error.stream_id):
                raise h2.exceptions.StreamClosedError(error.stream_id) from error
            raise
        self._prepare_for_sending(frames)
        return events

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list, list]:
        """A GOAWAY from the client leaves the connection open: the streams
        it already opened may still finish (RFC 9113 §6.8), and h2 would
        refuse to send anything more on them."""
        frames, events = super()._receive_goaway_frame(frame)
        self.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN
        return frames, events


def goaway_frame(last_stream_id: int, error_code: int) -> bytes:
    """A GOAWAY written by hand: h2's own would close its state machine, and
    a graceful one must leave the open streams running."""
    return GoAwayFrame(
        stream_id=0, last_stream_id=last_stream_id, error_code=error_code
    ).serialize()
