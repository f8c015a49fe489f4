"""RepeatedBlockDecoder decodes every header block as hpack's own decoder does."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.grpc_h2 import RepeatedBlockDecoder, RepeatedBlockEncoder

NAMES = [b":path", b"content-type", b"te", b"x-forwarded-for", b"x-request-id", b"grpc-timeout"]
VALUES = [b"/envoy.service.ext_proc.v3.ExternalProcessor/Process", b"application/grpc", b"t", b""]

header = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES) | st.binary(max_size=40))
header_list = st.lists(header, min_size=1, max_size=6)
step = st.one_of(
    st.tuples(st.just("send"), header_list, st.booleans()),
    st.tuples(st.just("again"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("table-size"), st.sampled_from([0, 64, 256, 4096]), st.booleans()),
)


def encode(encoder: hpack.Encoder, headers: list[tuple[bytes, bytes]], sensitive: bool) -> bytes:
    if sensitive:
        return encoder.encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers])
    return encoder.encode(headers)


@given(st.lists(step, max_size=40))
def test_blocks_decode_to_the_same_headers_and_leave_the_same_table(steps):
    encoder = hpack.Encoder()
    plain, remembering = hpack.Decoder(), RepeatedBlockDecoder()
    sent: list[list[tuple[bytes, bytes]]] = []
    for kind, value, sensitive in steps:
        if kind == "table-size":
            if value != encoder.header_table_size:  # hpack's encoder forgets a change set twice
                encoder.header_table_size = value
            continue
        if kind == "again":
            if not sent:
                continue
            headers = sent[value % len(sent)]
        else:
            headers = value
            sent.append(headers)
        block = encode(encoder, headers, sensitive)
        assert remembering.decode(block, raw=True) == plain.decode(block, raw=True)
        assert list(remembering.header_table.dynamic_entries) == list(
            plain.header_table.dynamic_entries
        )
        assert remembering.header_table_size == plain.header_table_size


def test_a_block_that_changes_nothing_is_decoded_by_hpack_once(monkeypatch):
    decoded = 0
    decode = hpack.Decoder.decode

    def counted(self, data, raw=False):
        nonlocal decoded
        decoded += 1
        return decode(self, data, raw)

    monkeypatch.setattr(hpack.Decoder, "decode", counted)
    encoder, decoder = hpack.Encoder(), RepeatedBlockDecoder()
    path = [hpack.NeverIndexedHeaderTuple(b":path", VALUES[0])]
    blocks = [encoder.encode(path) for _ in range(5)]
    assert len(set(blocks)) == 1
    assert [decoder.decode(block, raw=True) for block in blocks] == [[(b":path", VALUES[0])]] * 5
    assert decoded == 1


def test_a_block_that_adds_to_the_table_is_decoded_by_hpack_each_time(monkeypatch):
    decoded = 0
    decode = hpack.Decoder.decode

    def counted(self, data, raw=False):
        nonlocal decoded
        decoded += 1
        return decode(self, data, raw)

    monkeypatch.setattr(hpack.Decoder, "decode", counted)
    block = hpack.Encoder().encode([(b"x-request-id", b"1")])
    decoder = RepeatedBlockDecoder()
    decoder.decode(block, raw=True)
    decoder.decode(block, raw=True)
    assert decoded == 2
    assert len(decoder.header_table.dynamic_entries) == 2


def test_a_bad_block_still_raises_hpacks_error():
    with pytest.raises(hpack.HPACKDecodingError):
        RepeatedBlockDecoder().decode(b"\xff\xff\xff\xff\xff\xff", raw=True)


encode_step = st.one_of(
    st.tuples(st.just("send"), header_list, st.booleans()),
    st.tuples(st.just("again"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("table-size"), st.sampled_from([0, 64, 256, 4096]), st.booleans()),
)


@given(st.lists(encode_step, max_size=40))
def test_header_lists_encode_to_the_same_blocks_and_leave_the_same_table(steps):
    plain, remembering = hpack.Encoder(), RepeatedBlockEncoder()
    sent: list[list[tuple[bytes, bytes]]] = []
    for kind, value, sensitive in steps:
        if kind == "table-size":
            if value != plain.header_table_size:
                plain.header_table_size = remembering.header_table_size = value
            continue
        if kind == "again":
            if not sent:
                continue
            headers = sent[value % len(sent)]
        else:
            headers = value
            sent.append(headers)
        if sensitive:
            headers = [hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers]
        assert remembering.encode(headers) == plain.encode(headers)
        assert list(remembering.header_table.dynamic_entries) == list(
            plain.header_table.dynamic_entries
        )


def test_a_header_list_that_changes_nothing_is_encoded_by_hpack_once(monkeypatch):
    encoded = 0
    encode = hpack.Encoder.encode

    def counted(self, headers, huffman=True):
        nonlocal encoded
        encoded += 1
        return encode(self, headers, huffman)

    monkeypatch.setattr(hpack.Encoder, "encode", counted)
    encoder = RepeatedBlockEncoder()
    response = ((b":status", b"200"), (b"content-type", b"application/grpc"))
    blocks = [encoder.encode(response) for _ in range(5)]
    assert len(set(blocks)) == 2  # the first adds content-type to the table
    assert encoded == 2
