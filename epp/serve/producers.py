"""The optional live producers the configuration asks for, beside the
metrics scraper: the token producer (a request's prompt tokenized before the
core sees it), the KV-cache event subscribers (the precise prefix cache) and
the models scraper (the models-responder). Each is started into the server's
exit stack, so it stops with the server; where each one comes from applies
at the next restart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from epp.config.datalayer import ModelsSourceSettings
from epp.config.loader import EppConfig
from epp.config.precise import TokenizerBackend, TokenizerSettings
from epp.datalayer.models import ModelLists, ModelsScraper
from epp.datalayer.store import EndpointStore
from epp.scheduling.core import Core
from epp.scheduling.kvblocks import DigestMemo
from epp.serve.inputs import StartupError, fetched_as
from epp.serve.metrics import PluginDurations
from epp.serve.token_store import TokenCacheLimits

if TYPE_CHECKING:
    from epp.datalayer.kvevents import KVEventsSubscribers
    from epp.scheduling.kvblocks import PreciseConfig
    from epp.serve.tokenizer import Backend, TokenProducer

SCRAPE_TIMEOUT = 1.0
"""Seconds a scrape of one endpoint (metrics or model list) may take."""


def models_scraper(
    store: EndpointStore, lists: ModelLists, settings: ModelsSourceSettings, interval: float
) -> ModelsScraper:
    """What reads the pods' model lists for the models-responder (`interval`
    when the data source names none)."""
    tls = fetched_as(settings)
    return ModelsScraper(
        store,
        lists,
        interval=settings.interval or interval,
        timeout=SCRAPE_TIMEOUT,
        scheme=settings.scheme,
        path=settings.path,
        ssl_context=tls.ssl_context(),
    )


async def start_kv_events(
    stack: contextlib.AsyncExitStack, config: EppConfig, core: Core, store: EndpointStore
) -> KVEventsSubscribers | None:
    """Subscribe to the servers' KV-cache events when the precise prefix
    cache is configured, following the store's membership."""
    settings = config.kv_events
    if settings is None or core.kv_index is None:
        return None
    from epp.datalayer.kvevents import KVEventsSubscribers

    subscribers = KVEventsSubscribers(
        settings,
        store.addresses,
        lambda address, events: core.kv_events(address, events),
        lambda address: core.kv_endpoint_reset(address),
    )
    await stack.enter_async_context(subscribers)
    store.on_membership_change(subscribers.sync)
    return subscribers


async def start_token_producer(
    stack: contextlib.AsyncExitStack,
    config: EppConfig,
    durations: PluginDurations,
    limits: TokenCacheLimits,
    *,
    workers: bool,
    current: Callable[[], EppConfig],
) -> TokenProducer | None:
    """The token producer, when a token-producer with a tokenizing backend
    is configured; its block keys follow the configuration `current` gives.
    With `workers` the workers tokenize (`worker_token_producer`): None here."""
    settings = config.tokenizer
    if settings is None:
        return None
    from epp.serve.tokenizer import TokenizeError, backend_for

    try:
        backend = backend_for(settings, limits)
    except TokenizeError as error:
        raise StartupError(f"token-producer: {error}") from None
    if backend is None:
        return None
    if workers:
        await backend.close()  # it loads here: the workers, which tokenize, will too
        return None
    tally = durations.family.tally(token_producer_key(config))
    producer = _token_producer(
        settings, backend, tally.add, lambda: current().scheduling.precise, limits
    )
    stack.push_async_callback(producer.close)
    return producer


def tokenizes(config: EppConfig) -> bool:
    """Whether a token-producer with a tokenizing backend is configured."""
    settings = config.tokenizer
    return settings is not None and settings.backend is not TokenizerBackend.ESTIMATE


def token_producer_key(config: EppConfig) -> tuple[str, str, str]:
    """The token producer's labels on the plugin duration series."""
    name = next(n for n, t in config.plugins if t in ("token-producer", "tokenizer"))
    return ("DataProducer", "token-producer", name)


def worker_token_producer(
    settings: TokenizerSettings | None,
    precise: PreciseConfig | None,
    limits: TokenCacheLimits,
    observe: Callable[[float], None] | None = None,
) -> TokenProducer | None:
    """A protocol worker's token producer (`--workers`): the owner checked at
    start that its backend loads; its block keys are those of the precise
    producer the owner's configuration had when the worker started; each
    call's duration goes to `observe`."""
    if settings is None:
        return None
    from epp.serve.tokenizer import backend_for

    backend = backend_for(settings, limits)
    if backend is None:
        return None
    return _token_producer(settings, backend, observe, lambda: precise, limits)


def _token_producer(
    settings: TokenizerSettings,
    backend: Backend,
    observe: Callable[[float], None] | None,
    precise_now: Callable[[], PreciseConfig | None],
    limits: TokenCacheLimits,
) -> TokenProducer:
    """A token producer on `backend` whose block keys are those of the
    precise producer `precise_now` gives (none while it gives None), with
    a digest memo of `limits.memo_digests`; its caches reported in its stats."""
    from epp.serve.tokenizer import CacheUse, LocalTokenizer, TokenProducer

    memo = DigestMemo(limits.memo_digests)

    def keys(tokens: Sequence[int], salt: str | None) -> tuple[int, ...] | None:
        precise = precise_now()
        return precise.keys_of(tokens, salt, memo) if precise is not None else None

    def caches() -> dict[str, CacheUse]:
        found = {"digest-memo": CacheUse(len(memo), memo.capacity, memo.dropped)}
        if isinstance(backend, LocalTokenizer):
            found.update(backend.caches())
        return found

    producer = TokenProducer(settings, backend, observe, keys=keys)
    producer.stats.caches = caches
    return producer
