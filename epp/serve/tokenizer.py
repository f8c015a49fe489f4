"""The token producer: a request's prompt tokenized as the model server will
see it, before it is offered to the core, without blocking the event loop.

Backends (`epp.config.precise.TokenizerSettings`):

- `vllm`: POST the body (its model set to `modelName`) to the server's
  `/v1/chat/completions/render` or `/v1/completions/render`; a server without
  them (404) is asked `/tokenize` from then on. The loop only waits on a socket.
- `udsTokenizerConfig`: the reference's tokenizer sidecar, HTTP on a Unix
  socket: `/chat-template` renders a chat, `/tokenize` tokenizes text.
- `local`: the Hugging Face `tokenizers` library on the model directory's
  `tokenizer.json`, on the prompt text (no chat template): on the event loop
  up to `INLINE_CHARS`, beyond in a small thread pool (`tokenizers` releases
  the GIL while it encodes). A prompt whose text begins as one it
  tokenized before takes that one's tokens from its prefix store
  (`epp.serve.token_store`) and is routed on them alone (`PromptTokens`;
  the reference does so when they cover MIN_OVERLAP of it); covered less,
  its rest is encoded after it is routed, off its path, for the next
  prompt that begins as it. A shared system prompt or a conversation's
  earlier turns are tokenized once.
- `estimate`: nothing; tokens stay estimated (characters / 4).

Whatever happens, the request goes on: a backend slower than its timeout
(`timeout`; `mmTimeout` for a body with media), failing, or already
handling `max_concurrency` requests leaves the request with the estimate,
counted by reason in `TokenizerStats.fallbacks`. Each call's duration is
observed as the token-producer's plugin duration.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from epp.config.precise import TokenizerBackend, TokenizerSettings
from epp.scheduling.request import InferenceRequest
from epp.serve.token_store import (
    DEFAULT_LIMITS,
    MAX_LEARNING,
    MIN_OVERLAP,
    Found,
    PrefixTokenStore,
    TokenCacheLimits,
)

log = logging.getLogger(__name__)

CHAT_RENDER = "/v1/chat/completions/render"
COMPLETIONS_RENDER = "/v1/completions/render"
TOKENIZE = "/tokenize"
MAX_RESPONSE_BYTES = 64 << 20

INLINE_CHARS = 16_384
INLINE_TOKENS = 4_096
"""Prompts up to INLINE_CHARS characters are encoded, and their block keys
up to INLINE_TOKENS tokens hashed, on the event loop: about a millisecond
each, less than handing them to a thread costs (a thread waits for the GIL
up to a switch interval, 5 ms, each way, while the loop is busy)."""


class TokenizeError(Exception):
    """A backend could not tokenize a request."""


@dataclass(slots=True)
class CacheUse:
    """One of the token producer's bounded caches: what it holds, its
    limit, and what it dropped since the start, in its own unit. The caches:
    `prefix-store`, the local backend's (blocks; dropped: evicted),
    `digest-memo`, the block digests remembered for the precise prefix cache
    (digests; dropped when it started over), and `learning`, the prompts
    being encoded off their path (prompts; dropped: routed on the store's
    tokens, not learned)."""

    entries: int
    capacity: int
    dropped: int


def no_caches() -> dict[str, CacheUse]:
    return {}


@dataclass(slots=True)
class TokenizerStats:
    tokenized: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    """Requests left with the estimate, by reason: timeout, error, busy."""
    caches: Callable[[], dict[str, CacheUse]] = no_caches
    """The caches' use now, by name (the names `CacheUse` lists)."""


class Backend(Protocol):
    async def tokens(self, request: InferenceRequest) -> list[int]: ...

    async def close(self) -> None: ...


def _token_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise TokenizeError(f"{what} is not a list of token ids")
    return value


def _document(request: InferenceRequest) -> dict[str, Any]:
    try:
        document = orjson.loads(request.body) if request.body else {}
    except orjson.JSONDecodeError as error:
        raise TokenizeError(f"the body is no JSON: {error}") from None
    if not isinstance(document, dict):
        raise TokenizeError("the body is no JSON object")
    return document


async def _read_json(response: aiohttp.ClientResponse) -> Any:
    if response.content_length is not None and response.content_length > MAX_RESPONSE_BYTES:
        raise TokenizeError(f"a response of {response.content_length} bytes")
    # `read(n)` returns what has arrived, up to n: a long prompt's token
    # list comes in many chunks.
    chunks, size = [], 0
    while chunk := await response.content.read(MAX_RESPONSE_BYTES + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise TokenizeError("a response over the size limit")
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as error:
        raise TokenizeError(f"a response that is no JSON: {error}") from None


class VLLMRender:
    """The model server's render endpoints (and `/tokenize` for servers
    that have no render endpoints)."""

    def __init__(self, url: str, model: str) -> None:
        self._url = url.rstrip("/")
        self._model = model
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=16)
        )
        self.tokenize_only = False

    async def tokens(self, request: InferenceRequest) -> list[int]:
        document = _document(request)
        document["model"] = self._model
        chat = request.chat
        if not self.tokenize_only:
            path = CHAT_RENDER if chat else COMPLETIONS_RENDER
            async with self._session.post(self._url + path, json=document) as response:
                if response.status == 404:
                    self.tokenize_only = True
                else:
                    if response.status != 200:
                        raise TokenizeError(f"{path}: HTTP {response.status}")
                    reply = await _read_json(response)
                    if isinstance(reply, list):  # one per prompt; the first is routed on
                        reply = reply[0] if reply else None
                    if not isinstance(reply, dict):
                        raise TokenizeError(f"{path}: no render result")
                    return _token_list(reply.get("token_ids"), "token_ids")
        body: dict[str, Any] = {"model": self._model}
        if chat:
            body["messages"] = document.get("messages")
        else:
            body["prompt"] = document.get("prompt", request.prompt)
        async with self._session.post(self._url + TOKENIZE, json=body) as response:
            if response.status != 200:
                raise TokenizeError(f"{TOKENIZE}: HTTP {response.status}")
            reply = await _read_json(response)
        if not isinstance(reply, dict):
            raise TokenizeError(f"{TOKENIZE}: no tokens")
        return _token_list(reply.get("tokens"), "tokens")

    async def close(self) -> None:
        await self._session.close()


class UdsSidecar:
    """The reference's tokenizer sidecar: HTTP on a Unix socket."""

    def __init__(self, socket_file: str) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_file))

    async def tokens(self, request: InferenceRequest) -> list[int]:
        text = request.prompt
        if request.chat:
            messages = _document(request).get("messages")
            async with self._session.post(
                "http://tokenizer/chat-template", data=orjson.dumps(messages)
            ) as response:
                if response.status != 200:
                    raise TokenizeError(f"/chat-template: HTTP {response.status}")
                text = await response.text()
        async with self._session.post("http://tokenizer/tokenize", data=text.encode()) as response:
            if response.status != 200:
                raise TokenizeError(f"/tokenize: HTTP {response.status}")
            reply = await _read_json(response)
        if not isinstance(reply, dict):
            raise TokenizeError("/tokenize: no input_ids")
        return _token_list(reply.get("input_ids"), "input_ids")

    async def close(self) -> None:
        await self._session.close()


class PromptTokens(list[int]):
    """The tokens of a prompt's leading part (the prefix store's), and how
    many the whole prompt is estimated to have (`whole`)."""

    __slots__ = ("whole",)

    def __init__(self, tokens: list[int], whole: int) -> None:
        super().__init__(tokens)
        self.whole = whole


RESYNC_TOKENS = 8
RESYNC_TRIES = 4
"""A prompt found in the prefix store is encoded again from RESYNC_TOKENS
tokens before the end of what was found, and spliced where the two
encodings agree; where they do not agree at once (the cut fell inside a
pre-token), from one token earlier, RESYNC_TRIES times, then whole."""


class LocalTokenizer:
    """`tokenizer.json` from a model directory, encoding in worker threads,
    with a prefix store of what it encoded (module docstring)."""

    def __init__(
        self,
        model_dir: str,
        workers: int = 2,
        inline_chars: int = INLINE_CHARS,
        store: PrefixTokenStore | None = None,
        max_learning: int = MAX_LEARNING,
    ) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_dir) / "tokenizer.json"
        try:
            self._tokenizer = HFTokenizer.from_file(str(path))
        except Exception as error:
            raise TokenizeError(f"cannot load {path}: {error}") from None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="tokenizer"
        )
        self.inline_chars = inline_chars
        self.store = store if store is not None else PrefixTokenStore()
        self._learning: set[asyncio.Task[None]] = set()
        """Prompts routed on the store's tokens whose rest is being encoded."""
        self.max_learning = max_learning
        self.unlearned = 0
        """Prompts routed on the store's tokens and not learned, since the
        start: `max_learning` others were being encoded."""

    def caches(self) -> dict[str, CacheUse]:
        store = self.store
        return {
            "prefix-store": CacheUse(len(store), store.capacity, store.evictions),
            "learning": CacheUse(len(self._learning), self.max_learning, self.unlearned),
        }

    def encode(self, text: str) -> list[int]:
        return self.encode_with_ends(text)[0]

    def encode_with_ends(
        self, text: str, special: bool = True, release: bool = False
    ) -> tuple[list[int], list[int]]:
        """The token ids of `text` (with the special tokens the tokenizer
        adds, unless `special` is false) and where each ends in it;
        `release`: let go of the GIL while encoding (in a worker thread:
        `encode_batch` does, `encode` does not and is 10% faster)."""
        tokenizer = self._tokenizer
        encoding = (
            tokenizer.encode_batch([text], add_special_tokens=special)[0]
            if release
            else tokenizer.encode(text, add_special_tokens=special)
        )
        return encoding.ids, [end for _, end in encoding.offsets]

    async def _encoded(self, text: str, special: bool = True) -> tuple[list[int], list[int]]:
        if len(text) <= self.inline_chars:
            return self.encode_with_ends(text, special)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.encode_with_ends, text, special, True)

    async def tokens(self, request: InferenceRequest) -> list[int]:
        text = request.prompt
        found = self.store.find(text)
        if found is None:
            tokens, ends = await self._encoded(text)
            self.store.add(text, tokens, ends)
            return tokens
        if found.chars < MIN_OVERLAP * len(text):
            if len(self._learning) < self.max_learning:
                # The rest is encoded off the request's path, so that the next
                # prompt beginning as this one (the conversation's next turn)
                # finds it covered.
                task = asyncio.get_running_loop().create_task(self._learn(text, found))
                self._learning.add(task)
                task.add_done_callback(self._learning.discard)
            else:
                self.unlearned += 1
        tokens = found.tokens
        return PromptTokens(tokens, round(len(tokens) * len(text) / found.chars))

    async def _learn(self, text: str, found: Found) -> None:
        encoded = await self._extended(text, found) or await self._encoded(text)
        self.store.add(text, *encoded)

    async def learned(self) -> None:
        """Until the prompts being encoded off their requests' path are in the store."""
        while self._learning:
            await asyncio.gather(*self._learning)

    async def _extended(self, text: str, found: Found) -> tuple[list[int], list[int]] | None:
        """`found`'s tokens, then the rest of `text` encoded from a token
        end a few tokens back, spliced where the two encodings agree (None:
        they did not)."""
        tokens, ends = found.tokens, found.ends
        for back in range(RESYNC_TOKENS, RESYNC_TOKENS + RESYNC_TRIES):
            cut = len(tokens) - back
            if cut < 1:
                return None
            start = ends[cut - 1]
            tail, tail_ends = await self._encoded(text[start:], special=False)
            agree = 0
            for token, end in zip(tail, tail_ends, strict=False):
                at = cut + agree
                if at == len(tokens) or token != tokens[at] or end + start != ends[at]:
                    break
                agree += 1
            if agree:
                keep = cut + agree
                return (
                    tokens[:keep] + tail[agree:],
                    ends[:keep] + [end + start for end in tail_ends[agree:]],
                )
        return None

    async def close(self) -> None:
        for task in self._learning:
            task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def backend_for(
    settings: TokenizerSettings, limits: TokenCacheLimits = DEFAULT_LIMITS
) -> Backend | None:
    """The backend the settings name (None for the estimate)."""
    if settings.backend is TokenizerBackend.VLLM:
        return VLLMRender(settings.url, settings.model_name)
    if settings.backend is TokenizerBackend.UDS:
        return UdsSidecar(settings.socket_file)
    if settings.backend is TokenizerBackend.LOCAL:
        return LocalTokenizer(
            settings.model_dir,
            store=PrefixTokenStore(capacity=limits.store_blocks),
            max_learning=limits.max_learning,
        )
    return None


class TokenProducer:
    """Tokenizes requests with `backend`, bounded (module docstring)."""

    def __init__(
        self,
        settings: TokenizerSettings,
        backend: Backend,
        observe: Callable[[float], None] | None = None,
        stats: TokenizerStats | None = None,
        keys: Callable[[Sequence[int], str | None], tuple[int, ...] | None] | None = None,
        inline_tokens: int = INLINE_TOKENS,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.stats = stats if stats is not None else TokenizerStats()
        self._observe = observe
        self._in_flight = 0
        self._keys = keys
        self.inline_tokens = inline_tokens
        """The precise prefix cache's block keys of the tokens (None: not
        configured now), hashed in a worker thread past INLINE_TOKENS: a
        long prompt's keys take tens of milliseconds, which the event loop
        must not spend."""

    async def tokenize(self, request: InferenceRequest) -> None:
        """Set `request.token_ids` (and its token count); on any failure
        leave the estimate. Never raises (but cancellation)."""
        settings = self.settings
        if self._in_flight >= settings.max_concurrency:
            self.stats.fallbacks["busy"] += 1
            return
        self._in_flight += 1
        started = time.perf_counter()
        try:
            timeout = settings.mm_timeout if request.multimodal else settings.timeout
            async with asyncio.timeout(timeout):
                tokens = await self.backend.tokens(request)
        except TimeoutError:
            self.stats.fallbacks["timeout"] += 1
            return
        except (TokenizeError, aiohttp.ClientError, OSError, ValueError) as error:
            self.stats.fallbacks["error"] += 1
            log.debug("token-producer: %s; the request keeps its estimate", error)
            return
        except Exception:  # a backend's bug must not fail the request
            self.stats.fallbacks["error"] += 1
            log.exception("token-producer failed; the request keeps its estimate")
            return
        finally:
            self._in_flight -= 1
            if self._observe is not None:
                self._observe(time.perf_counter() - started)
        request.token_ids = tokens
        request.input_tokens = tokens.whole if isinstance(tokens, PromptTokens) else len(tokens)
        self.stats.tokenized += 1
        keys = self._keys
        if keys is not None and tokens:
            if len(tokens) <= self.inline_tokens:
                request.kv_block_keys = keys(tokens, request.cache_salt)
            else:
                request.kv_block_keys = await asyncio.to_thread(keys, tokens, request.cache_salt)

    async def close(self) -> None:
        await self.backend.close()
