"""Every endpoint's model list (`GET /v1/models`), for the `models-responder`.

The reference's `models-data-source` reads each endpoint's OpenAI model list
and `models-responder` answers the client's `GET /v1/models` itself with the
union of them, since one model server knows only its own models and LoRA
adapters. `ModelsScraper` reads each endpoint's list every `interval`
seconds (the source's own, else `--refresh-metrics-interval`, as the
reference's datalayer polls), at most `max_page_bytes` per page, one asyncio
task per endpoint following the store's membership; `ModelLists` keeps the
last list each endpoint answered (a failed read keeps the one before, as the
reference keeps the endpoint's attribute) and builds the answer:

- one entry per model `id`, the copy of the endpoint whose name sorts first,
  with the fields the reference returns (`id`, `object`, `created`,
  `owned_by`, `shutdown_date`, those the server reported), sorted by `id`,
  as `{"object": "list", "data": [...]}`;
- None while no endpoint in the pool has answered yet (the responder then
  answers 503, so a client retries instead of caching an empty list).

Cost: the answer is built once per change of the lists or the membership.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import aiohttp
import orjson

from epp.api.address import format_address, parse_address
from epp.datalayer.polling import EndpointPolls
from epp.datalayer.store import EndpointStore

log = logging.getLogger(__name__)

MODEL_FIELDS = ("id", "object", "created", "owned_by", "shutdown_date")
"""The fields of a model entry the responder returns (the reference's)."""

MAX_MODELS_PAGE_BYTES = 4 * 1024 * 1024
"""A model list larger than this fails the read."""


class ModelsPageError(ValueError):
    """A model list could not be read."""


def read_model_list(body: bytes) -> tuple[dict[str, Any], ...]:
    """The entries of an OpenAI `/v1/models` answer, each with the returned
    fields only; ModelsPageError when it is not one."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ModelsPageError(f"not JSON: {error}") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ModelsPageError("no 'data' list")
    entries = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise ModelsPageError(f"a model entry without a string 'id': {item!r}")
        entries.append({name: item[name] for name in MODEL_FIELDS if name in item})
    return tuple(entries)


class ModelLists:
    """The last model list of each endpoint, and the union the responder answers."""

    __slots__ = ("_answer", "_lists", "_names", "_store", "_version", "on_change")

    def __init__(self, store: EndpointStore) -> None:
        self._store = store
        self.on_change: Callable[[], None] | None = None
        """Called when a list changed or was dropped (under `--workers` the
        owner then sends the workers the new answer)."""
        self._lists: dict[str, tuple[dict[str, Any], ...]] = {}
        self._answer: bytes | None = None
        self._version: tuple[int, int] | None = None
        self._names: int = 0
        """Bumped at every change of a list, so the answer is rebuilt."""

    def set(self, address: str, models: tuple[dict[str, Any], ...]) -> None:
        if self._lists.get(address) != models:
            self._lists[address] = models
            self._names += 1
            self._changed()

    def forget_missing(self) -> None:
        """Drop the lists of endpoints no longer in the pool."""
        current = set(self._store.addresses())
        gone = [address for address in self._lists if address not in current]
        for address in gone:
            del self._lists[address]
            self._names += 1
        if gone:
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def answer(self) -> bytes | None:
        """The `GET /v1/models` answer body, or None while no endpoint of the
        pool has reported its list."""
        pool = self._store.snapshot()
        version = (pool.membership, self._names)
        if version != self._version:
            self._version = version
            self._answer = self._build(pool.endpoints)
        return self._answer

    def _build(self, endpoints: tuple) -> bytes | None:
        seen: dict[str, dict[str, Any]] = {}
        collected = 0
        for endpoint in sorted(endpoints, key=lambda endpoint: endpoint.name):
            models = self._lists.get(endpoint.address)
            if models is None:
                continue  # not read yet: it does not count
            collected += 1
            for model in models:
                seen.setdefault(model["id"], model)
        if not collected:
            return None
        data = [seen[model_id] for model_id in sorted(seen)]
        return orjson.dumps({"object": "list", "data": data})


@dataclass(slots=True, eq=False)
class ModelsScraper:
    """Reads every endpoint's model list into `lists` (see the module docstring).
    Use as `async with ModelsScraper(...)`."""

    store: EndpointStore
    lists: ModelLists
    _: KW_ONLY
    interval: float
    timeout: float = 1.0
    scheme: str = "http"
    path: str = "/v1/models"
    ssl_context: ssl.SSLContext | bool = False
    max_page_bytes: int = MAX_MODELS_PAGE_BYTES
    failures: int = field(default=0, init=False)
    _polls: EndpointPolls = field(init=False, repr=False)
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.timeout <= 0:
            raise ValueError(
                f"interval and timeout must be positive, got {self.interval}, {self.timeout}"
            )
        if self.scheme not in ("http", "https"):
            raise ValueError(f"models scheme must be http or https, got {self.scheme!r}")
        if not self.path.startswith("/"):
            raise ValueError(f"models path must start with '/', got {self.path!r}")
        self._polls = EndpointPolls(
            self.store, self.read_once, lambda: self.interval, "models", self.lists.forget_missing
        )

    async def __aenter__(self) -> ModelsScraper:
        # Each read has its own timeout, so the session has none.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        self._polls.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._polls.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def read_once(self, address: str) -> None:
        session = self._session
        if session is None or self.store.get(address) is None:
            return
        ip, port = parse_address(address)
        url = f"{self.scheme}://{format_address(ip, port)}{self.path}"
        try:
            async with asyncio.timeout(self.timeout):
                body = await _fetch(session, url, self.ssl_context, self.max_page_bytes)
            models = read_model_list(body)
        except (ModelsPageError, aiohttp.ClientError, TimeoutError) as error:
            self.failures += 1
            log.debug("model list of %s unavailable: %s", address, error or "timeout")
            return
        if self.store.get(address) is not None:
            self.lists.set(address, models)


async def _fetch(
    session: aiohttp.ClientSession, url: str, ssl_context: ssl.SSLContext | bool, limit: int
) -> bytes:
    async with session.get(url, ssl=ssl_context) as response:
        if response.status != 200:
            raise ModelsPageError(f"HTTP {response.status} from {url}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise ModelsPageError(f"model list of {url} is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
