"""Writes the `Accepted` condition of the objectives that apply to our pool.

A small work queue: whatever may change an objective's wanted status (its
own events, a pool change, becoming the leader) marks its name; the writer
then compares, and patches the status subresource only when the condition
differs (`epp.k8s.status.accepted_patch`). Our own write comes back as a
watch event, finds nothing to change, and ends there.

A 409 means the object changed after we read it; its new version is on the
way through the watch and will be compared again, so a conflict is simply
dropped. Other failures are retried after `retry_delay`.

Invariant: at most one write per version of an object seen in the cache.
Once a write computed from version V is answered (200: our write replaced V;
409: something else did), V is known to be superseded, and the watch will
bring its successor and mark the name again. Until then the cache still shows
V, and a mark from elsewhere (a pool event arrives on its own watch, which may
overtake the objectives' one) would write again from V: a needless write the
API server refuses with 409. So a name whose cached version is superseded
waits for the watch. One remembered version per objective the cache holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from epp.k8s.calls import call_json
from epp.k8s.objectives import GROUP, PLURAL, READ_VERSION
from epp.k8s.status import accepted_patch

log = logging.getLogger(__name__)

CONFLICT = 409


@dataclass(slots=True, eq=False)
class StatusWriter:
    """Marks go in (`mark`, `mark_all`); while `enabled`, patches go out.
    `objects` returns the latest raw object by name; `applies` says whether
    it applies to our pool."""

    api: CustomObjectsApi
    namespace: str
    objects: Callable[[], dict[str, dict[str, Any]]]
    applies: Callable[[str], bool]
    retry_delay: float = 1.0
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    enabled: bool = field(default=False, init=False)
    writes: int = field(default=0, init=False)
    """Status patches the API server accepted."""
    _dirty: set[str] = field(default_factory=set, init=False, repr=False)
    _superseded: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    """Per name, the resourceVersion our last answered write was computed
    from: the cache still showing it is behind the API server."""
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _busy: bool = field(default=False, init=False, repr=False)

    def mark(self, names: Iterable[str]) -> None:
        self._dirty.update(names)
        self._wakeup.set()

    @property
    def settled(self) -> bool:
        """Whether everything marked so far has been written (or found
        current, or not ours); retries pending count as unsettled."""
        return not self._dirty and not self._busy

    def mark_all(self) -> None:
        self.mark(self.objects())

    def set_enabled(self, enabled: bool) -> None:
        self.enabled = enabled
        if enabled:
            self.mark_all()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            self._busy = True
            names, self._dirty = self._dirty, set()
            failed = [name for name in sorted(names) if not await self._reconcile(name)]
            if failed:
                await asyncio.sleep(self.retry_delay)
                self.mark(failed)
            self._busy = False

    async def _reconcile(self, name: str) -> bool:
        """Bring one objective's status up to date; False if it must be retried."""
        obj = self.objects().get(name)
        if obj is None:
            self._superseded.pop(name, None)
            return True
        if not self.enabled or not self.applies(name):
            return True
        version = obj["metadata"]["resourceVersion"]
        if self._superseded.get(name) == version:
            return True
        self._superseded.pop(name, None)
        patch = accepted_patch(obj, self.clock())
        if patch is None:
            return True
        try:
            await call_json(
                self.api.patch_namespaced_custom_object_status,
                GROUP,
                READ_VERSION,
                self.namespace,
                PLURAL,
                name,
                patch,
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status == CONFLICT:
                self._superseded[name] = version
                log.debug("InferenceObjective %s changed while we wrote its status", name)
                return True
            log.warning(
                "InferenceObjective %s: status write failed: %s %s",
                name,
                error.status,
                error.reason,
            )
            return False
        except (TimeoutError, OSError) as error:
            log.warning("InferenceObjective %s: status write failed: %s", name, error)
            return False
        self._superseded[name] = version
        self.writes += 1
        log.info("InferenceObjective %s: Accepted", name)
        return True
