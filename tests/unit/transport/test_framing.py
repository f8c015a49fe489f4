"""MessageReader: gRPC messages reassembled from any split of DATA frames, in linear time."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.transport.framing import FramingError, MessageReader, Status, prefix, trailers
from epp.transport.turns import FrameCounter


def wire(*messages: bytes) -> bytes:
    return b"".join(prefix(len(message)) + message for message in messages)


@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(0, 3000), max_size=20),
)
def test_messages_come_out_whole_and_in_order_however_the_bytes_are_split(messages, cuts):
    data = wire(*messages)
    bounds = [0, *sorted(cut for cut in cuts if cut <= len(data)), len(data)]
    reader = MessageReader(1024)
    out = []
    for start, end in itertools.pairwise(bounds):
        out += reader.feed(data[start:end])
    assert out == messages
    assert reader.held == 0


def test_a_partial_message_is_held_until_it_completes():
    reader = MessageReader(1024)
    assert reader.feed(wire(b"hello")[:7]) == []
    assert reader.held == 7
    assert reader.feed(wire(b"hello")[7:]) == [b"hello"]


def test_a_prefix_over_the_limit_is_refused_before_the_message_is_buffered():
    reader = MessageReader(10)
    with pytest.raises(FramingError) as error:
        reader.feed(prefix(11))
    assert error.value.status == Status.RESOURCE_EXHAUSTED


def test_a_compressed_message_is_unimplemented():
    with pytest.raises(FramingError) as error:
        MessageReader(10).feed(b"\x01\x00\x00\x00\x01x")
    assert error.value.status == Status.UNIMPLEMENTED


def test_a_large_message_in_small_frames_is_reassembled_in_linear_time():
    """16 MiB in 1 KiB frames: re-copying the partial message per frame
    would move about 128 GiB."""
    payload = b"m" * (16 * 1024 * 1024)
    data = wire(payload)
    reader = MessageReader(len(payload))
    start = time.perf_counter()
    out = []
    for offset in range(0, len(data), 1024):
        out += reader.feed(data[offset : offset + 1024])
    assert time.perf_counter() - start < 5.0
    assert out == [payload]


def test_clear_drops_the_partial_message_and_says_how_much():
    reader = MessageReader(1024)
    reader.feed(wire(b"abcdef")[:8])
    assert reader.clear() == 8
    assert reader.held == 0


def test_trailers_carry_the_status_and_a_percent_encoded_message():
    assert trailers(Status.NOT_FOUND, "no such thing: 100%") == [
        (b"grpc-status", b"5"),
        (b"grpc-message", b"no such thing%3A 100%25"),
    ]
    assert trailers(Status.OK, "") == [(b"grpc-status", b"0")]


@given(
    st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0, 1, 3, 8])), max_size=30),
    st.lists(st.integers(0, 2000), max_size=10),
)
def test_a_turn_is_cut_only_at_a_frame_start_and_within_its_frame_budget(frames, cuts):
    """FrameCounter, fed reads as they come and what a turn left over first."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    starts, stream = [], bytearray(preface)
    for length, kind in frames:
        starts.append(len(stream))
        stream += length.to_bytes(3, "big") + bytes([kind, 0, 0, 0, 0, 1]) + b"x" * length
    bounds = [0, *sorted(cut for cut in cuts if cut <= len(stream)), len(stream)]
    counter, fed, backlog = FrameCounter(), 0, b""
    for start, end in itertools.pairwise(bounds):
        backlog += bytes(stream[start:end])
        while backlog:
            cut = counter.cut(backlog, 3, 2, 10_000)
            turn = range(fed, fed + cut)
            # a frame is the turn's whose header is complete in it
            assert sum(1 for s in starts if s + 8 in turn) <= 3
            assert (
                sum(
                    1
                    for s, (_, kind) in zip(starts, frames, strict=True)
                    if s + 8 in turn and kind == 1
                )
                <= 2
            )
            fed += cut
            backlog = backlog[cut:]
            if backlog:
                assert fed in starts
    assert fed == len(stream)
