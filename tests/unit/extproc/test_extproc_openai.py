"""OpenAI-style request bodies: API by path, required fields, token estimate, rewrite."""

from __future__ import annotations

import json

import pytest

from epp.extproc.openai import Api, BadRequest, api_for_path, parse_body


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", Api.CHAT_COMPLETIONS),
        ("/v1/completions", Api.COMPLETIONS),
        ("/v1/responses", Api.RESPONSES),
        ("/v1/embeddings?x=1", Api.EMBEDDINGS),
        ("/anything/else", Api.COMPLETIONS),
    ],
)
def test_api_is_chosen_by_path_suffix(path, api):
    assert api_for_path(path) is api


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_completion_prompt_stream_and_max_tokens_are_read():
    parsed = parse_body(
        "/v1/completions", body(model="m", prompt="abcdefgh", stream=True, max_tokens=9)
    )
    assert (parsed.model, parsed.prompt, parsed.stream, parsed.max_tokens) == (
        "m",
        "abcdefgh",
        True,
        9,
    )
    assert parsed.input_tokens == 2


def test_token_estimate_rounds_up_quarter_of_characters():
    assert parse_body("/v1/completions", body(model="m", prompt="abcde")).input_tokens == 2


def test_token_id_prompt_counts_one_token_per_id():
    parsed = parse_body("/v1/completions", body(model="m", prompt=[1, 2, 3]))
    assert (parsed.prompt, parsed.input_tokens) == ("", 3)


def test_chat_messages_become_role_content_lines_including_text_parts():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
    ]
    parsed = parse_body("/v1/chat/completions", body(model="m", messages=messages))
    assert parsed.prompt == "system: be brief\nuser: hi\n"


def test_chat_max_completion_tokens_is_read():
    parsed = parse_body(
        "/v1/chat/completions",
        body(model="m", messages=[{"role": "user", "content": "x"}], max_completion_tokens=4),
    )
    assert parsed.max_tokens == 4


def test_responses_input_string_and_max_output_tokens():
    parsed = parse_body("/v1/responses", body(model="m", input="hello", max_output_tokens=3))
    assert (parsed.prompt, parsed.max_tokens) == ("hello", 3)


def test_embeddings_list_of_strings():
    parsed = parse_body("/v1/embeddings", body(model="m", input=["ab", "cd"]))
    assert (parsed.prompt, parsed.input_tokens) == ("abcd", 1)


def test_body_is_passed_through_unchanged_without_rewrite():
    raw = b'{ "model" : "m", "prompt": "p" }'
    assert parse_body("/v1/completions", raw).body is raw


def test_rewrite_sets_target_model_in_body():
    parsed = parse_body("/v1/completions", body(model="m", prompt="p"), rewrite_to="lora")
    assert (parsed.model, parsed.target_model) == ("m", "lora")
    assert json.loads(parsed.body) == {"model": "lora", "prompt": "p"}


def test_rewrite_to_same_model_keeps_body():
    raw = body(model="m", prompt="p")
    assert parse_body("/v1/completions", raw, rewrite_to="m").body is raw


@pytest.mark.parametrize(
    ("path", "raw", "message"),
    [
        ("/v1/completions", b"{", "not valid JSON"),
        ("/v1/completions", b'"text"', "JSON object"),
        ("/v1/completions", b'{"prompt": "p"}', "missing required field 'model'"),
        ("/v1/completions", b'{"model": "", "prompt": "p"}', "non-empty string"),
        ("/v1/completions", b'{"model": "m"}', "missing required field 'prompt'"),
        ("/v1/chat/completions", b'{"model": "m"}', "missing required field 'messages'"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "non-empty list"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [3]}', "JSON object"),
        ("/v1/responses", b'{"model": "m"}', "missing required field 'input'"),
        ("/v1/embeddings", b'{"model": "m", "input": 5}', "string or a non-empty list"),
        ("/v1/completions", b'{"model": "m", "prompt": [1, "a"]}', "strings or token ids"),
        ("/v1/completions", b'{"model": "m", "prompt": "p", "stream": "yes"}', "boolean"),
        ("/v1/completions", b'{"model": "m", "prompt": "p", "max_tokens": -1}', "non-negative"),
        ("/v1/completions", b'{"model": "m", "prompt": "p", "max_tokens": true}', "non-negative"),
    ],
)
def test_malformed_body_raises_bad_request_naming_the_problem(path, raw, message):
    with pytest.raises(BadRequest, match=message):
        parse_body(path, raw)


def test_a_body_without_model_takes_the_default_model_when_one_is_given():
    parsed = parse_body("/v1/completions", body(prompt="p"), default_model="served")
    assert (parsed.model, parsed.target_model) == ("served", "served")


def test_a_responses_continuation_without_input_is_accepted():
    parsed = parse_body("/v1/responses", body(model="m", previous_response_id="resp_1"))
    assert (parsed.api, parsed.prompt, parsed.input_tokens) == (Api.RESPONSES, "", 0)


def test_a_responses_continuation_needs_a_string_id():
    with pytest.raises(BadRequest, match="previous_response_id"):
        parse_body("/v1/responses", body(model="m", previous_response_id=3))


def test_embeddings_sent_as_messages_are_accepted():
    messages = [{"role": "user", "content": "embed me"}]
    parsed = parse_body("/v1/embeddings", body(model="m", messages=messages))
    assert parsed.prompt == "user: embed me\n"


def test_responses_function_calls_and_outputs_count_in_the_prompt_text():
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"c":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"},
    ]
    parsed = parse_body("/v1/responses", body(model="m", input=items))
    assert 'get_weather({"c":1})' in parsed.prompt
    assert "sunny, 21C" in parsed.prompt
    assert parsed.input_tokens == -(-len(parsed.prompt) // 4)


def test_chat_tool_calls_count_in_the_prompt_text():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":2}'}}
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    parsed = parse_body("/v1/chat/completions", body(model="m", messages=messages))
    assert parsed.prompt == 'assistant: f({"x":2})\ntool: 42\n'
