"""Request parsers: which API a request speaks, chosen by its path.

As the reference's parser registry does, each configured parser claims path
suffixes and a request goes to the parser with the longest matching suffix;
a parser that claims none (`passthrough-parser`) is the fallback for every
other path, and parsers listed after it are never used. A path no parser
claims gets 400. The reference's default list is openai, anthropic,
vllmhttp, passthrough.

- `openai-parser`: `epp.extproc.openai`.
- `anthropic-parser`: `/v1/messages` (`messages` non-empty; text of the
  system prompt and the messages' text blocks; `model` optional) and
  `/v1/messages/count_tokens` (forwarded unread).
- `vllmhttp-parser`: `/inference/v1/generate` (`token_ids` or `prompt`).
- `passthrough-parser`: the body is not read; the request is routed
  without prompt-derived signals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from epp.extproc.openai import (
    Api,
    BadRequest,
    ParsedBody,
    estimate_tokens,
    has_media,
    json_object,
    parse_body,
    parts_text,
    read_stream,
    rewrite_model,
)

Parse = Callable[[str, bytes, str | None, str | None], ParsedBody]
"""(path, body, model rewrite target, default model) -> ParsedBody."""


def _unread(body: bytes) -> ParsedBody:
    return ParsedBody(Api.COMPLETIONS, "", "", "", False, None, 0, body)


def _model(document: dict[str, Any], default_model: str | None) -> str:
    model = document.get("model", default_model or "")
    if not isinstance(model, str):
        raise BadRequest("field 'model' must be a string")
    return model


def parse_anthropic(
    path: str, body: bytes, rewrite_to: str | None, default_model: str | None
) -> ParsedBody:
    if path.endswith("/count_tokens"):
        return _unread(body)
    document = json_object(body)
    messages = document.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("invalid messages request: must have at least one message")
    texts = [parts_text(document.get("system"), "system")]
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be a JSON object")
        texts.append(parts_text(message.get("content"), "content"))
    prompt = "".join(texts)
    max_tokens = document.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
    ):
        raise BadRequest("field 'max_tokens' must be a non-negative integer")
    model = _model(document, default_model)
    target, body = rewrite_model(document, body, model, rewrite_to)
    return ParsedBody(
        Api.CHAT_COMPLETIONS,
        model,
        target,
        prompt,
        read_stream(document),
        max_tokens,
        estimate_tokens(len(prompt)),
        body,
        has_media(messages),
    )


def parse_vllm_generate(
    path: str, body: bytes, rewrite_to: str | None, default_model: str | None
) -> ParsedBody:
    if not path.endswith("/inference/v1/generate"):
        return parse_body(path, body, rewrite_to, default_model)
    document = json_object(body)
    token_ids = document.get("token_ids")
    prompt = ""
    if token_ids is not None:
        if not isinstance(token_ids, list) or not all(
            isinstance(token, int) and not isinstance(token, bool) for token in token_ids
        ):
            raise BadRequest("field 'token_ids' must be a list of token ids")
        tokens = len(token_ids)
    else:
        prompt = document.get("prompt", "")
        if not isinstance(prompt, str):
            raise BadRequest("field 'prompt' must be a string")
        tokens = estimate_tokens(len(prompt))
    model = _model(document, default_model)
    return ParsedBody(
        Api.COMPLETIONS,
        model,
        model,
        prompt,
        read_stream(document),
        None,
        tokens,
        body,
        document=document,
    )


def parse_passthrough(
    path: str, body: bytes, rewrite_to: str | None, default_model: str | None
) -> ParsedBody:
    return _unread(body)


OPENAI_PATHS = (
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "conversations",
    "chat/completions/render",
    "completions/render",
    "images/generations",
)


@dataclass(slots=True, frozen=True)
class Parser:
    """A parser: the path suffixes it claims (none: the fallback) and how it parses."""

    paths: tuple[str, ...]
    parse: Parse


OPENAI = Parser(OPENAI_PATHS, parse_body)
ANTHROPIC = Parser(("messages", "messages/count_tokens"), parse_anthropic)
VLLM_HTTP = Parser(("inference/v1/generate",), parse_vllm_generate)
PASSTHROUGH = Parser((), parse_passthrough)
DEFAULT_PARSERS = (OPENAI, ANTHROPIC, VLLM_HTTP, PASSTHROUGH)
"""The reference's parsers when the configuration names none."""


@dataclass(slots=True, frozen=True)
class ParserSet:
    """The configured parsers, resolved by longest path suffix."""

    claims: tuple[tuple[str, Parse], ...]
    """(suffix, parse), longest suffix first."""
    fallback: Parse | None

    def parse(
        self, path: str, body: bytes, rewrite_to: str | None, default_model: str | None
    ) -> ParsedBody:
        path = path.split("?", 1)[0].rstrip("/") or "/v1/completions"
        for suffix, parse in self.claims:
            if path.endswith(suffix):
                return parse(path, body, rewrite_to, default_model)
        if self.fallback is None:
            raise BadRequest(f"no parser registered matching path suffix for: {path}")
        return self.fallback(path, body, rewrite_to, default_model)


def parser_set(parsers: Sequence[Parser]) -> ParserSet:
    """`parsers` in order, up to the first that claims no path (the fallback)."""
    claims: list[tuple[str, Parse]] = []
    fallback: Parse | None = None
    seen: list[Parser] = []
    for parser in parsers:
        if parser in seen:
            continue
        seen.append(parser)
        if not parser.paths:
            fallback = parser.parse
            break
        claims.extend(("/" + path, parser.parse) for path in parser.paths)
    claims.sort(key=lambda claim: -len(claim[0]))
    return ParserSet(tuple(claims), fallback)
