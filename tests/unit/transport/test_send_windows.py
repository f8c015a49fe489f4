"""The server's send windows follow RFC 9113 §6.9 exactly, though a change
of SETTINGS_INITIAL_WINDOW_SIZE or SETTINGS_MAX_FRAME_SIZE touches no
stream: checked against an eager model of the windows, frame by frame."""

from __future__ import annotations

import h2.config
import h2.errors
import h2.events
import h2.exceptions
import hpack
import pytest
from hyperframe.frame import (
    HeadersFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.transport.h2_internals import CREDIT_HEAP_SLACK, MAX_WINDOW, ServerH2Connection

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 4, 5
REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/t.T/M"),
    (b":authority", b"t"),
    (b"content-type", b"application/grpc"),
]


class Peer:
    """A server connection, and the client's side of it as raw frames."""

    def __init__(self) -> None:
        self.server = ServerH2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.server.initiate_connection()
        self.encoder = hpack.Encoder()
        self.next_stream = 1
        self.receive(PREFACE + SettingsFrame(0).serialize())
        # The connection's window out of the way: stream windows are tested.
        self.receive(WindowUpdateFrame(0, window_increment=MAX_WINDOW - 65_535).serialize())

    def receive(self, data: bytes) -> list[h2.events.Event]:
        events = self.server.receive_data(data)
        self.server.data_to_send()
        return events

    def open(self) -> int:
        stream_id, self.next_stream = self.next_stream, self.next_stream + 2
        frame = HeadersFrame(stream_id, data=self.encoder.encode(REQUEST))
        frame.flags.add("END_HEADERS")
        self.receive(frame.serialize())
        return stream_id

    def settings(self, **values: int) -> list[h2.events.Event]:
        codes = {"initial_window": INITIAL_WINDOW_SIZE, "max_frame_size": MAX_FRAME_SIZE}
        frame = SettingsFrame(0, settings={codes[name]: value for name, value in values.items()})
        return self.receive(frame.serialize())

    def window_update(self, stream_id: int, increment: int) -> list[h2.events.Event]:
        return self.receive(WindowUpdateFrame(stream_id, window_increment=increment).serialize())

    def reset(self, stream_id: int) -> None:
        self.receive(RstStreamFrame(stream_id, error_code=8).serialize())

    def send(self, stream_id: int, size: int) -> int:
        """Send what of `size` bytes the stream's window lets through, in one frame."""
        size = min(size, self.server.local_flow_control_window(stream_id), 16_384)
        if size > 0:
            self.server.send_data(stream_id, b"d" * size)
            self.server.data_to_send()
        return max(size, 0)


window_value = st.one_of(
    st.integers(0, MAX_WINDOW),
    st.sampled_from([0, 1, 16_384, 65_535, 65_536, MAX_WINDOW - 1, MAX_WINDOW]),
)
step = st.one_of(
    st.tuples(st.just("open"), st.just(0), st.just(0)),
    st.tuples(st.just("settings"), st.just(0), window_value),
    st.tuples(st.just("update"), st.integers(0, 7), window_value.filter(bool)),
    st.tuples(st.just("send"), st.integers(0, 7), st.integers(1, 40_000)),
    st.tuples(st.just("reset"), st.integers(0, 7), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40))
def test_send_windows_move_with_the_initial_window_as_rfc_9113_says(steps):
    peer = Peer()
    initial, connection = 65_535, MAX_WINDOW
    model: dict[int, int] = {}
    """Each open stream's send window, adjusted eagerly."""
    for kind, index, value in steps:
        streams = sorted(model)
        stream_id = streams[index % len(streams)] if streams else None
        if kind == "open":
            model[peer.open()] = initial
        elif kind == "settings":
            delta = value - initial
            if any(window + delta > MAX_WINDOW for window in model.values()):
                with pytest.raises(h2.exceptions.FlowControlError):
                    peer.settings(initial_window=value)
                return  # a connection error (§6.9.2): nothing more to check
            peer.settings(initial_window=value)
            initial = value
            model = {sid: window + delta for sid, window in model.items()}
        elif stream_id is None:
            continue
        elif kind == "update":
            events = peer.window_update(stream_id, value)
            if model[stream_id] + value > MAX_WINDOW:  # a stream error (§6.9.1)
                [reset] = events
                assert isinstance(reset, h2.events.StreamReset)
                assert reset.error_code == h2.errors.ErrorCodes.FLOW_CONTROL_ERROR
                del model[stream_id]
            else:
                model[stream_id] += value
        elif kind == "send":
            sent = peer.send(stream_id, value)
            model[stream_id] -= sent
            connection -= sent
        else:
            peer.reset(stream_id)
            del model[stream_id]
        for sid, window in model.items():
            assert peer.server.streams[sid].outbound_flow_control_window == window
            assert peer.server.local_flow_control_window(sid) == min(window, connection)


def test_a_lower_initial_window_takes_a_stream_below_zero_until_updates_lift_it():
    peer = Peer()
    stream = peer.open()
    assert peer.send(stream, 16_384) == 16_384
    peer.settings(initial_window=1_000)
    assert peer.server.local_flow_control_window(stream) == 1_000 - 16_384
    assert peer.send(stream, 1) == 0
    peer.window_update(stream, 15_385)
    assert peer.server.local_flow_control_window(stream) == 1
    assert peer.send(stream, 100) == 1


def test_an_initial_window_that_would_lift_a_stream_past_the_maximum_ends_the_connection():
    peer = Peer()
    stream = peer.open()
    peer.window_update(stream, MAX_WINDOW - 65_535)  # the stream's window is at the maximum
    with pytest.raises(h2.exceptions.FlowControlError):
        peer.settings(initial_window=65_536)
    assert peer.server.data_to_send().endswith(
        h2.errors.ErrorCodes.FLOW_CONTROL_ERROR.to_bytes(4, "big")  # GOAWAY's error code
    )


def test_a_stream_that_sent_what_lifted_it_no_longer_bounds_the_initial_window():
    peer = Peer()
    peer.settings(initial_window=0)
    stream = peer.open()
    peer.window_update(stream, 10_000)
    assert peer.send(stream, 10_000) == 10_000
    peer.settings(initial_window=MAX_WINDOW)
    assert peer.server.streams[stream].outbound_flow_control_window == MAX_WINDOW


def test_a_closed_stream_above_the_maximum_does_not_count():
    peer = Peer()
    stream = peer.open()
    peer.window_update(stream, MAX_WINDOW - 65_535)
    peer.reset(stream)
    peer.settings(initial_window=MAX_WINDOW)
    assert peer.server.local_flow_control_window(peer.open()) == MAX_WINDOW


def test_a_new_frame_size_applies_to_open_and_new_streams():
    peer = Peer()
    before = peer.open()
    peer.settings(max_frame_size=20_000)
    after = peer.open()
    assert peer.server.max_outbound_frame_size == 20_000
    assert peer.server.streams[before].max_outbound_frame_size == 20_000
    assert peer.server.streams[after].max_outbound_frame_size == 20_000


def test_streams_above_the_initial_window_are_remembered_within_a_bound():
    peer = Peer()
    for _ in range(1_000):
        stream = peer.open()
        peer.window_update(stream, 10)
        peer.reset(stream)
    windows = peer.server.send_windows
    assert len(windows.heap) <= 2 + CREDIT_HEAP_SLACK + 1
    assert len(windows.credits) <= len(windows.heap)
