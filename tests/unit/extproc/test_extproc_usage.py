"""Usage from response bodies, and restoring the client's model name."""

from __future__ import annotations

from epp.extproc.usage import ModelNameRestorer, SseUsageReader, Usage, usage_from_json


def test_chat_usage_from_json():
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}'
    assert usage_from_json(body) == Usage(3, 4)


def test_responses_api_usage_from_json():
    assert usage_from_json(b'{"usage": {"input_tokens": 2, "output_tokens": 5}}') == Usage(2, 5)


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


def test_sse_first_usage_wins():
    reader = SseUsageReader()
    reader.feed(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\n')
    reader.feed(b'data: {"usage":{"prompt_tokens":8,"completion_tokens":9}}\n')
    assert reader.usage == Usage(1, 2)


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
