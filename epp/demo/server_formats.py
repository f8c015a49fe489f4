"""The OpenAI bodies a simulated model server answers with, as vLLM writes them.

Request side (`read_request`): what vLLM reads from a body: the model
(absent: the first served name), the prompt (chat `messages`, completions
`prompt`, Responses `input` or a `previous_response_id`, embeddings `input`
or `messages`), the output length (`max_completion_tokens` before
`max_tokens` for chat, `max_output_tokens` for Responses; null means unset)
and the stream options. Prompts are sized at 4 characters a token.

Reply side (`Reply`): `chatcmpl-` ids and a role chunk first for chat,
`cmpl-` for completions, `resp_` with `response.*` events for Responses;
`logprobs: null` in every choice; usage as a last chunk with
`stream_options.include_usage`, and cumulative on every chunk with
`continuous_usage_stats`; errors as `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson
from xxhash import xxh32_intdigest

from epp.extproc import openai

CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 16
"""Output tokens of a request that sets no limit (vLLM: up to the context)."""
TOKEN_TEXT = " x"
EMBEDDING_SIZE = 8


class Api(Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"


class RequestError(Exception):
    """A request vLLM refuses: status, message, OpenAI error type, param."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, "BadRequestError", param)


@dataclass(slots=True, frozen=True)
class InferenceRequest:
    api: Api
    model: str
    prompt_tokens: int
    output_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    previous_response_id: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    """vLLM's P/D connector parameters, as given."""
    prompt_text: str = ""
    """The prompt's text (empty for token ids), for the prefix cache."""


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; RequestError as vLLM would answer."""
    return openai.json_object(
        raw, bad_request, "JSON decode error: ", "the request body must be a JSON object"
    )


def read_request(api: Api, raw: bytes, served: tuple[str, ...]) -> InferenceRequest:
    """What vLLM reads from `raw`; RequestError as vLLM would answer."""
    body = json_object(raw)
    model = body.get("model")
    if model is None:
        model = served[0]
    if not isinstance(model, str) or model not in served:
        raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompt_text, prompt_tokens = _prompt(api, body)
    output_tokens = 1 if api is Api.EMBEDDINGS else _output_tokens(api, body)
    stream = body.get("stream") is True
    options = body.get("stream_options")
    options = options if isinstance(options, dict) else {}
    include_usage = options.get("include_usage") is True
    previous = body.get("previous_response_id") if api is Api.RESPONSES else None
    kv = body.get("kv_transfer_params")
    return InferenceRequest(
        api,
        model,
        prompt_tokens,
        output_tokens,
        stream,
        include_usage,
        include_usage and options.get("continuous_usage_stats") is True,
        previous if isinstance(previous, str) else None,
        kv if isinstance(kv, dict) else None,
        prompt_text,
    )


def _tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


VOCABULARY = 151_000


def token_ids(text: str) -> list[int]:
    """The simulated server's tokenizer: one token per `CHARS_PER_TOKEN`
    characters (as many as `prompt_tokens` counts), its id a hash of them."""
    count = _tokens(text)
    step = CHARS_PER_TOKEN
    return [
        xxh32_intdigest(text[i * step : (i + 1) * step].encode()) % VOCABULARY for i in range(count)
    ]


def prompt_of(api: Api, body: dict[str, Any]) -> str:
    """The prompt's text as the server reads it (for its tokenizer)."""
    return _prompt(api, body)[0]


def _text_of(value: Any) -> str:
    """The text of a string, a list of strings or parts, or a message list."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        parts = [value.get(key) for key in ("content", "text", "arguments", "output")]
        return "".join(_text_of(part) for part in parts if part is not None)
    if isinstance(value, list):
        return "".join(_text_of(item) for item in value if not isinstance(item, int))
    return ""


def _prompt(api: Api, body: dict[str, Any]) -> tuple[str, int]:
    """The prompt's text and tokens."""
    if api is Api.CHAT or (api is Api.EMBEDDINGS and "input" not in body):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("`messages` must be a non-empty list", "messages")
        text = _text_of(messages)
        return text, _tokens(text)
    if api is Api.RESPONSES and "input" not in body:
        if isinstance(body.get("previous_response_id"), str):
            return "", 0
        raise bad_request("`input` is required", "input")
    name = "prompt" if api is Api.COMPLETIONS else "input"
    value = body.get(name)
    if isinstance(value, list) and value and all(isinstance(item, int) for item in value):
        return "", len(value)
    if not isinstance(value, str | list) or not value:
        raise bad_request(f"`{name}` is required", name)
    text = _text_of(value)
    return text, _tokens(text)


MAX_TOKENS_FIELDS = {
    Api.COMPLETIONS: ("max_tokens",),
    Api.CHAT: ("max_completion_tokens", "max_tokens"),
    Api.RESPONSES: ("max_output_tokens",),
}


def _output_tokens(api: Api, body: dict[str, Any]) -> int:
    for name in MAX_TOKENS_FIELDS[api]:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad_request(f"`{name}` must be a positive integer", name)
        return value
    return DEFAULT_MAX_TOKENS


_ids = itertools.count(1)


@dataclass(slots=True)
class Reply:
    """Builds the bodies of one response: whole, or as SSE events."""

    api: Api
    model: str
    prompt_tokens: int
    output_tokens: int
    continuous_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    request_id: str = ""
    cached_tokens: int | None = None
    """Prompt tokens read from the prefix cache, once known: reported in the
    usage's `prompt_tokens_details` (`input_tokens_details` for Responses),
    as vLLM does with `--enable-prompt-tokens-details`."""

    def __post_init__(self) -> None:
        prefix = {
            Api.CHAT: "chatcmpl-",
            Api.COMPLETIONS: "cmpl-",
            Api.RESPONSES: "resp_",
            Api.EMBEDDINGS: "embd-",
        }
        self.request_id = f"{prefix[self.api]}{next(_ids):08x}"

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        responses = self.api is Api.RESPONSES
        usage: dict[str, Any] = {
            "input_tokens" if responses else "prompt_tokens": self.prompt_tokens,
            "output_tokens" if responses else "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }
        if self.cached_tokens is not None:
            details = "input_tokens_details" if responses else "prompt_tokens_details"
            usage[details] = {"cached_tokens": self.cached_tokens}
        return usage

    # -- whole bodies -------------------------------------------------------------

    def whole(self) -> dict[str, Any]:
        tokens = self.output_tokens
        if self.api is Api.EMBEDDINGS:
            return {
                "id": self.request_id,
                "object": "list",
                "created": self.created,
                "model": self.model,
                "data": [
                    {"index": 0, "object": "embedding", "embedding": [0.125] * EMBEDDING_SIZE}
                ],
                "usage": {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens},
            }
        if self.api is Api.RESPONSES:
            return self._response("completed", TOKEN_TEXT * tokens, self.usage(tokens))
        if self.api is Api.CHAT:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": TOKEN_TEXT * tokens, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        else:
            choice = self._text_choice(tokens, "length")
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.api is Api.CHAT else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(tokens),
        }

    def _response(self, status: str, text: str, usage: dict[str, int] | None) -> dict[str, Any]:
        output = []
        if status == "completed":
            output = [
                {
                    "type": "message",
                    "id": f"msg_{self.request_id[5:]}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        return {
            "id": self.request_id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "output": output,
            "usage": usage,
        }

    def _text_choice(self, tokens: int, finish: str | None) -> dict[str, Any]:
        return {
            "index": 0,
            "text": TOKEN_TEXT * tokens,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }

    # -- stream events ------------------------------------------------------------

    def first_events(self) -> bytes:
        """What goes out before the first token: chat's role chunk, the
        Responses `response.created` event; nothing for completions."""
        if self.api is Api.CHAT:
            delta = {"role": "assistant", "content": ""}
            return self._chunk([self._delta_choice(delta, None)], 0)
        if self.api is Api.RESPONSES:
            return _event("response.created", {"response": self._response("in_progress", "", None)})
        return b""

    def token_events(self, tokens: int, sent_before: int, last: bool) -> bytes:
        """`tokens` more tokens (the request's last ones when `last`)."""
        sent = sent_before + tokens
        finish = "length" if last else None
        if self.api is Api.RESPONSES:
            return _event("response.output_text.delta", {"delta": TOKEN_TEXT * tokens})
        if self.api is Api.CHAT:
            choice = self._delta_choice({"content": TOKEN_TEXT * tokens}, finish)
        else:
            choice = self._text_choice(tokens, finish)
        return self._chunk([choice], sent)

    def final_events(self, include_usage: bool) -> bytes:
        tokens = self.output_tokens
        if self.api is Api.RESPONSES:
            completed = self._response("completed", TOKEN_TEXT * tokens, self.usage(tokens))
            return _event("response.completed", {"response": completed})
        out = b""
        if include_usage:
            payload = self._payload([])
            payload["usage"] = self.usage(tokens)
            out = b"data: " + orjson.dumps(payload) + b"\n\n"
        return out + b"data: [DONE]\n\n"

    def _delta_choice(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def _payload(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.api is Api.CHAT else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _chunk(self, choices: list[dict[str, Any]], completion_tokens: int) -> bytes:
        payload = self._payload(choices)
        if self.continuous_usage:
            payload["usage"] = self.usage(completion_tokens)
        return b"data: " + orjson.dumps(payload) + b"\n\n"


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    data = orjson.dumps({"type": kind, **payload})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"
