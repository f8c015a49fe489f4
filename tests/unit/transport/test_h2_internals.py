"""RepeatedBlockDecoder and RepeatedBlockEncoder code every header block as
hpack's own decoder and encoder do."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import hpack
import hpack.exceptions
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.transport.h2_internals import (
    MAX_TABLE_SIZE_UPDATES,
    RepeatedBlockDecoder,
    RepeatedBlockEncoder,
    table_size_updates,
)

NAMES = [b":path", b"content-type", b"te", b"x-forwarded-for", b"x-request-id", b"grpc-timeout"]
VALUES = [b"/envoy.service.ext_proc.v3.ExternalProcessor/Process", b"application/grpc", b"t", b""]
TABLE_SIZES = [0, 64, 256, 4096]

header = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES) | st.binary(max_size=40))
header_list = st.lists(header, min_size=1, max_size=6)
step = st.one_of(
    st.tuples(st.just("send"), header_list, st.booleans()),
    st.tuples(st.just("again"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("table-size"), st.sampled_from(TABLE_SIZES), st.booleans()),
)
Headers = list[tuple[bytes, bytes]]


def header_lists(steps: list[tuple], resize: Callable[[int], None]) -> Iterator[list]:
    """The header lists `steps` send, new or again, sensitive ones as
    never-indexed tuples; table-size steps call `resize` instead."""
    sent: list[Headers] = []
    for kind, value, sensitive in steps:
        if kind == "table-size":
            resize(value)
            continue
        if kind == "again":
            if not sent:
                continue
            headers = sent[value % len(sent)]
        else:
            headers = value
            sent.append(headers)
        if sensitive:
            yield [hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers]
        else:
            yield headers


def calls_counted(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """Count the calls of `cls.name` (hpack's own coding); the count is the list's one item."""
    count = [0]
    method = getattr(cls, name)

    def counted(self, *args, **kwargs):
        count[0] += 1
        return method(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return count


@given(st.lists(step, max_size=40))
def test_blocks_decode_to_the_same_headers_and_leave_the_same_table(steps):
    encoder = hpack.Encoder()
    plain, remembering = hpack.Decoder(), RepeatedBlockDecoder()

    def resize(size: int) -> None:
        if size != encoder.header_table_size:  # hpack's encoder forgets a change set twice
            encoder.header_table_size = size

    for headers in header_lists(steps, resize):
        block = encoder.encode(headers)
        if table_size_updates(block) > MAX_TABLE_SIZE_UPDATES:
            with pytest.raises(hpack.exceptions.HPACKDecodingError):
                remembering.decode(block, raw=True)
            return
        assert remembering.decode(block, raw=True) == plain.decode(block, raw=True)
        assert list(remembering.header_table.dynamic_entries) == list(
            plain.header_table.dynamic_entries
        )
        assert remembering.header_table_size == plain.header_table_size


def test_a_block_that_changes_nothing_is_decoded_by_hpack_once(monkeypatch):
    decoded = calls_counted(monkeypatch, hpack.Decoder, "decode")
    encoder, decoder = hpack.Encoder(), RepeatedBlockDecoder()
    path = [hpack.NeverIndexedHeaderTuple(b":path", VALUES[0])]
    blocks = [encoder.encode(path) for _ in range(5)]
    assert len(set(blocks)) == 1
    assert [decoder.decode(block, raw=True) for block in blocks] == [[(b":path", VALUES[0])]] * 5
    assert decoded == [1]


def test_a_block_that_adds_to_the_table_is_decoded_by_hpack_each_time(monkeypatch):
    decoded = calls_counted(monkeypatch, hpack.Decoder, "decode")
    block = hpack.Encoder().encode([(b"x-request-id", b"1")])
    decoder = RepeatedBlockDecoder()
    decoder.decode(block, raw=True)
    decoder.decode(block, raw=True)
    assert decoded == [2]
    assert len(decoder.header_table.dynamic_entries) == 2


def test_a_block_that_adds_to_the_table_adds_again_when_the_table_is_back_as_it_was():
    block = hpack.Encoder().encode([(b"x-request-id", b"1")])
    emptied = b"\x20\x3f\xe1\x1f"  # table size updates: to 0, then back to 4096
    decoder = RepeatedBlockDecoder()
    decoder.decode(block, raw=True)
    decoder.decode(emptied, raw=True)
    assert decoder.decode(block, raw=True) == [(b"x-request-id", b"1")]
    assert list(decoder.header_table.dynamic_entries) == [(b"x-request-id", b"1")]


def test_a_bad_block_still_raises_hpacks_error():
    with pytest.raises(hpack.HPACKDecodingError):
        RepeatedBlockDecoder().decode(b"\xff\xff\xff\xff\xff\xff", raw=True)


@given(st.lists(step, max_size=40))
def test_header_lists_encode_to_the_same_blocks_and_leave_the_same_table(steps):
    plain, remembering = hpack.Encoder(), RepeatedBlockEncoder()

    def resize(size: int) -> None:
        if size != plain.header_table_size:
            plain.header_table_size = remembering.header_table_size = size

    for headers in header_lists(steps, resize):
        assert remembering.encode(headers) == plain.encode(headers)
        assert list(remembering.header_table.dynamic_entries) == list(
            plain.header_table.dynamic_entries
        )


def test_a_header_list_that_changes_nothing_is_encoded_by_hpack_once(monkeypatch):
    encoded = calls_counted(monkeypatch, hpack.Encoder, "encode")
    encoder = RepeatedBlockEncoder()
    response = ((b":status", b"200"), (b"content-type", b"application/grpc"))
    blocks = [encoder.encode(response) for _ in range(5)]
    assert len(set(blocks)) == 2  # the first adds content-type to the table
    assert encoded == [2]
