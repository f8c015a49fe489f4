"""Usage from response bodies, and restoring the client's model name."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given
from hypothesis import strategies as st

from epp.extproc.usage import (
    MAX_SSE_LINE_BYTES,
    ModelNameRestorer,
    SseUsageReader,
    Usage,
    usage_from_json,
)


def test_chat_usage_from_json():
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}'
    assert usage_from_json(body) == Usage(3, 4)


def test_responses_api_usage_from_json():
    assert usage_from_json(b'{"usage": {"input_tokens": 2, "output_tokens": 5}}') == Usage(2, 5)


def test_cached_prompt_tokens_are_read_where_each_api_reports_them():
    chat = b'{"usage": {"prompt_tokens": 9, "completion_tokens": 1,'
    chat += b' "prompt_tokens_details": {"cached_tokens": 8}}}'
    responses = b'{"usage": {"input_tokens": 9, "output_tokens": 1,'
    responses += b' "input_tokens_details": {"cached_tokens": 6}}}'
    anthropic = b'{"usage": {"input_tokens": 9, "output_tokens": 1, "cache_read_input_tokens": 4}}'
    assert usage_from_json(chat) == Usage(9, 1, 8)
    assert usage_from_json(responses) == Usage(9, 1, 6)
    assert usage_from_json(anthropic) == Usage(9, 1, 4)


def test_cached_tokens_are_none_when_the_server_does_not_report_them():
    details_null = b'{"usage": {"prompt_tokens": 9, "completion_tokens": 1,'
    details_null += b' "prompt_tokens_details": null}}'
    assert usage_from_json(details_null) == Usage(9, 1, None)


def test_no_usage_or_bad_json_gives_none():
    assert usage_from_json(b'{"usage": null}') is None
    assert usage_from_json(b"not json") is None
    assert usage_from_json(b'{"usage": {"prompt_tokens": "3"}}') is None


def test_sse_usage_split_across_chunks_is_found():
    reader = SseUsageReader()
    event = b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    reader.feed(event[:17])
    assert reader.usage is None
    reader.feed(event[17:])
    assert reader.usage == Usage(1, 2)


def chunk(delta: str, completion_tokens: int, finish: str | None = None) -> bytes:
    """One chat chunk as vLLM streams it with continuous_usage_stats: the
    cumulative usage on every chunk."""
    choice = {"index": 0, "delta": {"content": delta}, "logprobs": None, "finish_reason": finish}
    usage = {
        "prompt_tokens": 17,
        "completion_tokens": completion_tokens,
        "total_tokens": 17 + completion_tokens,
    }
    event = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [choice],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


CONTINUOUS_USAGE_BODY = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":17,"completion_tokens":0,"total_tokens":17}}\n\n'
    + b"".join(chunk(" x", n) for n in range(1, 12))
    + chunk(" x", 12, "length")
    + b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[],'
    b'"usage":{"prompt_tokens":17,"completion_tokens":12,"total_tokens":29}}\n\n'
    b"data: [DONE]\n\n"
)


def read_in_pieces(body: bytes, cuts: list[int]) -> Usage | None:
    reader = SseUsageReader()
    for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
        reader.feed(body[start:end])
    reader.finish()
    return reader.usage


def test_sse_last_usage_wins():
    reader = SseUsageReader()
    reader.feed(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\n')
    reader.feed(b'data: {"usage":{"prompt_tokens":8,"completion_tokens":9}}\n')
    assert reader.usage == Usage(8, 9)


def test_continuous_usage_stats_give_the_whole_requests_usage():
    assert read_in_pieces(CONTINUOUS_USAGE_BODY, []) == Usage(17, 12)


def test_continuous_usage_stats_split_at_every_byte_give_the_same_usage():
    for cut in range(1, len(CONTINUOUS_USAGE_BODY)):
        assert read_in_pieces(CONTINUOUS_USAGE_BODY, [cut]) == Usage(17, 12), cut


def test_continuous_usage_stats_fed_byte_by_byte_give_the_same_usage():
    cuts = list(range(1, len(CONTINUOUS_USAGE_BODY)))
    assert read_in_pieces(CONTINUOUS_USAGE_BODY, cuts) == Usage(17, 12)


@given(st.sets(st.integers(1, len(CONTINUOUS_USAGE_BODY) - 1), max_size=40))
def test_continuous_usage_stats_split_anywhere_give_the_same_usage(cuts):
    assert read_in_pieces(CONTINUOUS_USAGE_BODY, sorted(cuts)) == Usage(17, 12)


def test_nothing_after_done_is_read():
    reader = SseUsageReader()
    reader.feed(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    reader.feed(b'data: {"usage":{"prompt_tokens":8,"completion_tokens":9}}\n')
    reader.finish()
    assert reader.usage == Usage(1, 2)
    assert reader.done


def test_sse_null_usage_is_skipped():
    reader = SseUsageReader()
    reader.feed(
        b'data: {"usage":null}\r\ndata: {"usage":{"prompt_tokens":1,"completion_tokens":0}}\r\n'
    )
    assert reader.usage == Usage(1, 0)


def test_sse_last_line_without_newline_is_read_at_finish():
    reader = SseUsageReader()
    reader.feed(b'data: {"usage":{"prompt_tokens":4,"completion_tokens":1}}')
    assert reader.usage is None
    reader.finish()
    assert reader.usage == Usage(4, 1)


def test_restorer_replaces_only_the_target_model_value():
    restorer = ModelNameRestorer("client", "target")
    chunk = b'{"model": "target", "other": "target", "x":{"model":"target"}}'
    assert (
        restorer.restore(chunk) == b'{"model": "client", "other": "target", "x":{"model":"client"}}'
    )


def test_restorer_escapes_names():
    restorer = ModelNameRestorer('a\\b"c', "t.*")
    assert (
        restorer.restore(b'{"model":"t.*"} {"model":"tx"}')
        == b'{"model":"a\\\\b\\"c"} {"model":"tx"}'
    )


SSE_STREAM = (
    b'data: {"choices": [{"text": "a"}], "usage": null}\n\n'
    b"data: " + b'{"filler": "' + b"x" * 300 + b'"}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}\n\n'
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(0, len(SSE_STREAM)), max_size=12))
def test_sse_usage_is_the_same_however_the_stream_is_split(cuts):
    reader = SseUsageReader()
    bounds = [0, *sorted(cuts), len(SSE_STREAM)]
    for start, end in itertools.pairwise(bounds):
        reader.feed(SSE_STREAM[start:end])
    reader.finish()
    assert reader.usage == Usage(7, 9)


def test_sse_line_over_the_cap_is_skipped_and_the_next_usage_is_read():
    reader = SseUsageReader()
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens"')
    for _ in range(MAX_SSE_LINE_BYTES // 1024 + 1):
        reader.feed(b"x" * 1024)
    reader.feed(b'}\ndata: {"usage": {"prompt_tokens": 5, "completion_tokens": 6}}\n')
    assert reader.usage == Usage(5, 6)


def test_sse_reader_holds_at_most_the_cap_of_an_endless_line():
    reader = SseUsageReader()
    chunk = b"y" * 1024
    for _ in range(16 * 1024):  # 16 MiB in 1 KiB chunks: linear, or this takes minutes
        reader.feed(chunk)
    assert len(reader._partial) <= MAX_SSE_LINE_BYTES
