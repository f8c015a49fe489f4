"""Token usage reported by the model server, read from a JSON or SSE response body.

Chat/Completions report `usage.prompt_tokens` / `usage.completion_tokens`;
the Responses API reports `usage.input_tokens` / `usage.output_tokens`, in
SSE inside the `response.completed` event's `response` object. In SSE the
last event carrying a usage object before `data: [DONE]` (or the end of the
body) wins: with `stream_options.continuous_usage_stats` vLLM sends the
cumulative usage on every chunk, so the last one is the whole request's.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from epp.flowcontrol.request import Usage


def usage_from_document(document: Any) -> Usage | None:
    """Usage from one decoded JSON response object or SSE event, if it has one."""
    if not isinstance(document, dict):
        return None
    usage = document.get("usage")
    if not isinstance(usage, dict):
        response = document.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return None
    input_tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
    output_tokens = usage.get("completion_tokens", usage.get("output_tokens", 0))
    if not _is_count(input_tokens) or not _is_count(output_tokens):
        return None
    return Usage(input_tokens, output_tokens, _cached_tokens(usage))


def _cached_tokens(usage: dict) -> int | None:
    for details in ("prompt_tokens_details", "input_tokens_details"):
        found = usage.get(details)
        if isinstance(found, dict) and _is_count(cached := found.get("cached_tokens")):
            return cached
    cached = usage.get("cache_read_input_tokens")
    return cached if _is_count(cached) else None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def usage_from_json(body: bytes) -> Usage | None:
    try:
        return usage_from_document(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


MAX_SSE_LINE_BYTES = 64 * 1024
"""A longer SSE line is skipped unread (a usage event is a few hundred bytes)."""


class SseUsageReader:
    """Feeds SSE chunks as they pass, in time linear in their size: lines
    are read where they lie in the chunk, and only the unfinished last line
    is kept, appended to in place, up to MAX_SSE_LINE_BYTES. `usage` is the
    latest usage seen; `done` once `data: [DONE]` was read (nothing after it
    is read)."""

    __slots__ = ("_partial", "_skipping", "done", "usage")

    def __init__(self) -> None:
        self._partial = bytearray()
        self._skipping = False
        """The line being held grew over the cap; it is dropped up to its end."""
        self.usage: Usage | None = None
        self.done = False

    def feed(self, chunk: bytes) -> None:
        if self.done:
            return
        first = chunk.find(b"\n")
        if first < 0:
            self._hold(chunk)
            return
        if self._partial or self._skipping:
            self._hold(chunk[:first])
            line, skipped = bytes(self._partial), self._skipping
            self._partial.clear()
            self._skipping = False
            if not skipped:
                self._read_line(line)
        else:
            self._read_line(chunk[:first])
        last = chunk.rfind(b"\n")
        if last > first and not self.done:
            for line in chunk[first + 1 : last].split(b"\n"):
                self._read_line(line)
                if self.done:
                    break
        if not self.done:
            self._hold(chunk[last + 1 :])

    def finish(self) -> None:
        """The body ended: read a last line that had no newline."""
        if not self.done and self._partial and not self._skipping:
            self._read_line(bytes(self._partial))
        self._partial.clear()
        self._skipping = False

    def _hold(self, data: bytes) -> None:
        if self._skipping or not data:
            return
        if len(self._partial) + len(data) > MAX_SSE_LINE_BYTES:
            self._partial.clear()
            self._skipping = True
            return
        self._partial += data

    def _read_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        if line[5:].strip() == b"[DONE]":
            self.done = True
            return
        if b'"usage"' not in line or b'"usage":null' in line or b'"usage": null' in line:
            return
        try:
            usage = usage_from_document(orjson.loads(line[5:]))
        except orjson.JSONDecodeError:
            return
        if usage is not None:
            self.usage = usage


class ModelNameRestorer:
    """Puts the client's model name back where the server answered with the target's.

    Works per chunk: a `"model": "<target>"` pair split across two chunks is
    left as is (the reference EPP rewrites per chunk too).
    """

    __slots__ = ("_pattern", "_replacement")

    def __init__(self, client_model: str, target_model: str) -> None:
        target = re.escape(orjson.dumps(target_model))
        self._pattern = re.compile(rb'("model"\s*:\s*)' + target)
        self._replacement = rb"\g<1>" + orjson.dumps(client_model).replace(b"\\", b"\\\\")

    def restore(self, chunk: bytes) -> bytes:
        if b'"model"' not in chunk:
            return chunk
        return self._pattern.sub(self._replacement, chunk)
