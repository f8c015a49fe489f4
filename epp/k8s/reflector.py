"""List, then watch from the list's resourceVersion, for ever (client-go's Reflector).

- Every event and bookmark advances the resourceVersion the next watch
  resumes from, so a dropped connection or a server-side timeout costs one
  new watch request and no re-list.
- A 410 Gone (the version was compacted away) leads to a full re-list; the
  handler's `replace` receives the complete set and diffs it against what it
  knows. kubernetes-asyncio's `Watch` retries a 410 once with the same stale
  version when no `timeout_seconds` is given; we always give one, so the 410
  reaches us at once, whether the server sent it as the HTTP status of the
  watch request or as an ERROR event in the stream.
- Any other failure (connection refused, 5xx, a broken stream) waits with
  exponential backoff and retries; the known resourceVersion is kept, so a
  short outage needs no re-list either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from epp.k8s.calls import call_json

log = logging.getLogger(__name__)

GONE = 410

ListFunction = Callable[..., Awaitable[Any]]
"""A kubernetes-asyncio `list_*` method (it takes `watch`, `resource_version`, ...)."""


class Handler(Protocol):
    def replace(self, objects: list[dict[str, Any]]) -> None:
        """A full list: the objects are exactly these now."""

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""


@dataclass(slots=True, frozen=True)
class WatchSettings:
    timeout_seconds: int = 300
    """Server-side lifetime of one watch request; the watch resumes after it."""
    backoff_initial: float = 0.5
    backoff_max: float = 30.0


class Reflector:
    """Keeps `handler` in step with one list+watch. `synced` is set after the
    first complete list; `lists` counts lists (the first one and re-lists)."""

    def __init__(
        self,
        description: str,
        func: ListFunction,
        handler: Handler,
        settings: WatchSettings | None = None,
        **kwargs: Any,
    ) -> None:
        self.description = description
        self._func = func
        self._kwargs = kwargs
        self._handler = handler
        self._settings = settings or WatchSettings()
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.lists = 0

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = self._settings.backoff_initial
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
                backoff = self._settings.backoff_initial
            except ApiException as error:
                if error.status == GONE:
                    log.info(
                        "%s: resourceVersion %s is gone (410), re-listing",
                        self.description,
                        self.resource_version,
                    )
                    self.resource_version = None
                    continue
                log.warning(
                    "%s: API error %s %s; retrying in %.2fs",
                    self.description,
                    error.status,
                    error.reason,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._settings.backoff_max)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
                log.warning(
                    "%s: %s: %s; retrying in %.2fs",
                    self.description,
                    type(error).__name__,
                    error,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._settings.backoff_max)

    async def _list(self) -> None:
        result = await call_json(self._func, **self._kwargs)
        self.lists += 1
        self._handler.replace(list(result.get("items") or ()))
        self.resource_version = (result.get("metadata") or {}).get("resourceVersion")
        log.debug(
            "%s: listed %d at resourceVersion %s",
            self.description,
            len(result.get("items") or ()),
            self.resource_version,
        )
        self.synced.set()

    async def _watch(self) -> None:
        timeout = self._settings.timeout_seconds
        async with Watch(return_type="object") as watch:
            stream = watch.stream(
                self._func,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=timeout + 30,
                **self._kwargs,
            )
            async for event in stream:
                kind = event["type"]
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._handler.event(kind, event["raw_object"])
                resource_version = _resource_version(event["raw_object"])
                if resource_version:
                    self.resource_version = resource_version


def _resource_version(obj: Any) -> str | None:
    if not isinstance(obj, Mapping):
        return None
    return (obj.get("metadata") or {}).get("resourceVersion")
