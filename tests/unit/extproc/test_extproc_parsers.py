"""Parsers chosen by path as the reference's registry chooses them."""

from __future__ import annotations

import json

import pytest

from epp.extproc.openai import BadRequest
from epp.extproc.parsers import (
    ANTHROPIC,
    DEFAULT_PARSERS,
    OPENAI,
    PASSTHROUGH,
    VLLM_HTTP,
    parser_set,
)

DEFAULTS = parser_set(DEFAULT_PARSERS)


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_anthropic_messages_are_read_with_system_and_text_blocks() -> None:
    parsed = DEFAULTS.parse(
        "/v1/messages",
        body(
            model="claude",
            system="be brief",
            max_tokens=64,
            stream=True,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "hello"}]},
                {"role": "assistant", "content": "hi"},
            ],
        ),
        None,
        None,
    )
    assert (parsed.model, parsed.prompt, parsed.max_tokens, parsed.stream) == (
        "claude",
        "be briefhellohi",
        64,
        True,
    )
    assert parsed.input_tokens == 4


def test_anthropic_images_mark_the_request_multimodal() -> None:
    messages = [{"role": "user", "content": [{"type": "image", "source": {}}]}]
    assert DEFAULTS.parse("/v1/messages", body(model="c", messages=messages), None, None).multimodal


def test_anthropic_without_messages_is_400() -> None:
    with pytest.raises(BadRequest, match="at least one message"):
        DEFAULTS.parse("/v1/messages", body(model="c", messages=[]), None, None)


def test_anthropic_count_tokens_is_forwarded_unread() -> None:
    parsed = DEFAULTS.parse("/v1/messages/count_tokens", b"not json", None, None)
    assert parsed.body == b"not json" and parsed.prompt == ""


def test_vllm_generate_counts_token_ids() -> None:
    parsed = DEFAULTS.parse("/inference/v1/generate", body(token_ids=[1, 2, 3]), None, None)
    assert parsed.input_tokens == 3


def test_an_unclaimed_path_falls_back_to_passthrough() -> None:
    parsed = DEFAULTS.parse("/v1/rerank?x=1", b"\x00binary", None, None)
    assert parsed.body == b"\x00binary" and parsed.model == ""


def test_without_a_fallback_an_unclaimed_path_is_400() -> None:
    with pytest.raises(BadRequest, match="no parser registered"):
        parser_set((OPENAI,)).parse("/v1/rerank", b"{}", None, None)


def test_the_longest_claimed_suffix_wins() -> None:
    chat = body(model="m", messages=[{"role": "user", "content": "x"}])
    assert DEFAULTS.parse("/v1/chat/completions", chat, None, None).prompt


def test_parsers_after_the_fallback_are_never_used() -> None:
    parsers = parser_set((PASSTHROUGH, ANTHROPIC))
    assert parsers.claims == ()
    assert parsers.parse("/v1/messages", b"x", None, None).body == b"x"


def test_vllmhttp_claims_only_the_generate_path() -> None:
    parsers = parser_set((VLLM_HTTP, PASSTHROUGH))
    completions = body(model="m", prompt="hello")
    assert parsers.parse("/v1/completions", completions, None, None).prompt == ""
