"""OpenAI-style request bodies: what the EPP needs from them, and the model rewrite.

The API is chosen by the suffix of `:path` (query string ignored), as the
reference EPP's openai-parser does; an unknown path is read as
`/v1/completions`. Each API has one required prompt field, and accepts
what vLLM accepts besides:

    /chat/completions  messages (non-empty list of message objects)
    /completions       prompt   (string, list of strings, or token ids)
    /responses         input    (string or list of items); may be absent
                                when previous_response_id continues a response
    /embeddings        input    (string, list of strings, or token ids), or
                                messages (vLLM's chat-style embeddings)

A request without `model` gets 400, as in the reference, unless a default
model is given (vLLM serves such a request with its served model). The
prompt text (for prefix matching and the token estimate) includes tool
calls: a chat message's `tool_calls` and the Responses items
`function_call` (name, arguments) and `function_call_output` (output).
Input tokens are estimated as characters / 4 (rounded up), token-id arrays
count one per id. Anything malformed raises `BadRequest` (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from epp.flowcontrol.request import FlowRequest

CHARS_PER_TOKEN = 4


class Api(Enum):
    COMPLETIONS = "completions"
    CHAT_COMPLETIONS = "chat-completions"
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"


PROMPT_FIELD = {
    Api.COMPLETIONS: "prompt",
    Api.CHAT_COMPLETIONS: "messages",
    Api.RESPONSES: "input",
    Api.EMBEDDINGS: "input",
}
MAX_TOKENS_FIELDS = {
    Api.COMPLETIONS: ("max_tokens",),
    Api.CHAT_COMPLETIONS: ("max_completion_tokens", "max_tokens"),
    Api.RESPONSES: ("max_output_tokens",),
    Api.EMBEDDINGS: (),
}


class BadRequest(ValueError):
    """The request body cannot be served; the message says why (HTTP 400)."""


@dataclass(slots=True)
class ParsedBody:
    """What the EPP reads from a request body.

    `body` is what goes upstream: the original bytes, or the re-serialised
    JSON when the model name was rewritten (then `target_model != model`).
    """

    api: Api
    model: str
    target_model: str
    prompt: str
    stream: bool
    max_tokens: int | None
    input_tokens: int
    body: bytes
    multimodal: bool = False
    """Whether a message carries an image, audio or video part."""
    document: dict[str, Any] | None = field(default=None, repr=False)
    """The body as a JSON object, for a parser whose body can carry the
    engine's `priority` field (openai, vllmhttp); None for the others."""


def api_for_path(path: str) -> Api:
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return Api.CHAT_COMPLETIONS
    if path.endswith("/responses"):
        return Api.RESPONSES
    if path.endswith("/embeddings"):
        return Api.EMBEDDINGS
    return Api.COMPLETIONS


def json_object(
    body: bytes,
    refuse: Callable[[str], Exception] = BadRequest,
    not_json: str = "body is not valid JSON: ",
    not_object: str = "body must be a JSON object",
) -> dict[str, Any]:
    """`body` as a JSON object; `refuse(message)` raised when it is not one
    (BadRequest, 400, unless a caller answering as another server words it
    its way): `not_json` followed by the decoder's error, or `not_object`."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise refuse(f"{not_json}{error}") from None
    if not isinstance(document, dict):
        raise refuse(not_object)
    return document


def read_stream(document: dict[str, Any]) -> bool:
    """The request's `stream` flag; absent or null is False."""
    stream = document.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise BadRequest("field 'stream' must be a boolean")
    return stream


def rewrite_model(
    document: dict[str, Any], body: bytes, model: str, rewrite_to: str | None
) -> tuple[str, bytes]:
    """(target model, body to send): the body is re-serialised only when the
    rewrite target differs from the client's model."""
    if not rewrite_to or rewrite_to == model:
        return model, body
    document["model"] = rewrite_to
    return rewrite_to, orjson.dumps(document)


def parse_body(
    path: str, body: bytes, rewrite_to: str | None = None, default_model: str | None = None
) -> ParsedBody:
    """Parse and validate `body` for the API named by `path`.

    `rewrite_to` is the model-rewrite target from the request headers; when it
    differs from the body's `model`, the body is re-serialised with it.
    `default_model` is the model of a body without one (None: 400).
    """
    api = api_for_path(path)
    document = json_object(body)
    model = document.get("model")
    if model is None:
        if default_model is None:
            raise BadRequest("missing required field 'model'")
        model = default_model
    if not isinstance(model, str) or not model:
        raise BadRequest("field 'model' must be a non-empty string")
    prompt, tokens = _read_request_prompt(api, document)
    stream = read_stream(document)
    max_tokens = _read_max_tokens(api, document)
    target, body = rewrite_model(document, body, model, rewrite_to)
    messages = document.get("messages") if api is not Api.RESPONSES else document.get("input")
    multimodal = isinstance(messages, list) and has_media(messages)
    return ParsedBody(
        api, model, target, prompt, stream, max_tokens, tokens, body, multimodal, document
    )


VLLM_ENGINE_LABELS = ("llm-d.ai/engine-type", "inference.networking.k8s.io/engine-type")
"""The pod labels that name a vLLM target for priority propagation (the
reference reads these two, whatever `engineLabelKey` says)."""


def engine_priority(priority: int, labels: Mapping[str, str]) -> int:
    """The value of the body's `priority` for an objective's `priority` on an
    endpoint with `labels`: vLLM serves lower values first, so it gets the
    negation; other engines (SGLang) and unlabelled pods get it as it is, as
    in the reference (llm-d-router PR #2265)."""
    engine = labels.get(VLLM_ENGINE_LABELS[0]) or labels.get(VLLM_ENGINE_LABELS[1]) or ""
    return -priority if engine.lower() == "vllm" else priority


def engine_priority_on(
    labels_of: Callable[[str], Mapping[str, str]],
) -> Callable[[FlowRequest], int]:
    """The forwarded body's priority of a dispatched request: its priority
    by `engine_priority` on the labels `labels_of` gives its endpoint."""
    return lambda request: engine_priority(request.priority, labels_of(request.endpoint or ""))


def with_priority(document: dict[str, Any], priority: int) -> bytes:
    """The body re-serialised with `priority`, replacing the client's own."""
    document["priority"] = priority
    return orjson.dumps(document)


MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "input_video"}
)
"""Content part types that carry media (OpenAI, vLLM and Anthropic names)."""


def has_media(messages: list[Any]) -> bool:
    """Whether any message's content list has a media part."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                    return True
    return False


def _read_request_prompt(api: Api, document: dict[str, Any]) -> tuple[str, int]:
    field = PROMPT_FIELD[api]
    if field in document:
        return _read_prompt(api, field, document[field])
    if api is Api.EMBEDDINGS and "messages" in document:
        return _read_prompt(Api.CHAT_COMPLETIONS, "messages", document["messages"])
    if api is Api.RESPONSES and "previous_response_id" in document:
        previous = document["previous_response_id"]
        if not isinstance(previous, str) or not previous:
            raise BadRequest("field 'previous_response_id' must be a non-empty string")
        return "", 0
    raise BadRequest(f"missing required field '{field}'")


def _read_max_tokens(api: Api, document: dict[str, Any]) -> int | None:
    for name in MAX_TOKENS_FIELDS[api]:
        value = document.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"field '{name}' must be a non-negative integer")
        return value
    return None


def estimate_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def _read_prompt(api: Api, field: str, value: Any) -> tuple[str, int]:
    """Return (prompt text, estimated input tokens) or raise BadRequest."""
    if api is Api.CHAT_COMPLETIONS:
        if not isinstance(value, list) or not value:
            raise BadRequest("field 'messages' must be a non-empty list")
        text = "".join(_message_text(message) for message in value)
        return text, estimate_tokens(len(text))
    if api is Api.RESPONSES:
        if isinstance(value, str):
            return value, estimate_tokens(len(value))
        if not isinstance(value, list):
            raise BadRequest("field 'input' must be a string or a list")
        text = "".join(_message_text(item) for item in value)
        return text, estimate_tokens(len(text))
    return _read_text_or_tokens(field, value)


def _read_text_or_tokens(field: str, value: Any) -> tuple[str, int]:
    """A string, a list of strings, a list of token ids, or a list of those lists."""
    if isinstance(value, str):
        return value, estimate_tokens(len(value))
    if not isinstance(value, list) or not value:
        raise BadRequest(f"field '{field}' must be a string or a non-empty list")
    if all(isinstance(item, str) for item in value):
        text = "".join(value)
        return text, estimate_tokens(len(text))
    if _is_token_ids(value):
        return "", len(value)
    if all(isinstance(item, list) and _is_token_ids(item) for item in value):
        return "", sum(len(item) for item in value)
    raise BadRequest(f"field '{field}' must hold strings or token ids")


def _is_token_ids(items: list[Any]) -> bool:
    return all(isinstance(item, int) and not isinstance(item, bool) for item in items)


def _message_text(message: Any) -> str:
    """The text of one chat message or Responses input item: `role: content`
    and each tool call as `name(arguments)`, one line."""
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        raise BadRequest("each message must be a JSON object")
    kind = message.get("type")
    if kind == "function_call":
        return f"{_text(message.get('name'))}({_text(message.get('arguments'))})\n"
    if kind == "function_call_output":
        return f"tool: {parts_text(message.get('output'), 'output')}\n"
    role = message.get("role", "")
    if not isinstance(role, str):
        raise BadRequest("field 'role' must be a string")
    text = parts_text(message.get("content"), "content")
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                text += f"{_text(function.get('name'))}({_text(function.get('arguments'))})"
    return f"{role}: {text}\n"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parts_text(content: Any, field: str) -> str:
    """A string, or the text of a list of parts (strings or `{"text": ...}`)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"field '{field}' must be a string or a list of parts")
