"""Leader election with a coordination.k8s.io/v1 Lease, as client-go does it.

Every `retry_period` a candidate reads the Lease. The holder renews it
(`renewTime`); another candidate takes it over when it is free (no holder,
e.g. after a release) or when the record has not changed for the record's
`leaseDurationSeconds` as measured on the candidate's own monotonic clock,
so clocks of different machines never need to agree. Every write carries the
resourceVersion that was read, so of two candidates racing for the same
Lease exactly one wins (the other gets 409). A leader that cannot renew for
`renew_deadline` steps down before its lease can expire elsewhere; on
shutdown it releases the Lease so that a successor need not wait. A
candidate that `step_down`s (a decider that drains) releases it at once
and competes no more, but goes on reading it, so it still knows who holds
it.

kubernetes-asyncio has a `leaderelection` package, but it cannot release the
lease, stamps times from the local time zone as if it were UTC, refuses
periods under one second, and stops competing after the first loss.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import CoordinationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from epp.k8s.calls import call_json

log = logging.getLogger(__name__)

NOT_FOUND = 404
CONFLICT = 409


def lease_name(namespace: str, pool_name: str) -> str:
    """The Lease the reference EPP uses for a pool."""
    return f"epp-{namespace}-{pool_name}.gateway-api-inference-extension.sigs.k8s.io"


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime: RFC 3339 in UTC with exactly six fractional digits."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True, frozen=True)
class LeaseSettings:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election needs lease duration > renew deadline > retry period > 0, got "
                f"{self.lease_duration}, {self.renew_deadline}, {self.retry_period}"
            )


@dataclass(slots=True, eq=False)
class LeaderElector:
    """Competes for the Lease `name` until cancelled; `is_leader` tells the
    outcome and `on_change(is_leader)` hears of every change."""

    api: CoordinationV1Api
    name: str
    namespace: str
    identity: str
    settings: LeaseSettings = field(default_factory=LeaseSettings)
    on_change: Callable[[bool], None] | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    is_leader: bool = field(default=False, init=False)
    annotations: dict[str, str] = field(default_factory=dict, init=False)
    """What this candidate writes on the Lease while it holds it (the
    decider's address, `epp.serve.decider`)."""
    observed_annotations: dict[str, str] = field(default_factory=dict, init=False)
    """The Lease's annotations as last read."""
    transitions: int = field(default=0, init=False)
    """The Lease's `leaseTransitions` as last read or written: a fencing
    counter, one more at every change of holder."""
    competing: bool = field(default=True, init=False)
    """Whether it takes and renews the Lease (False after `step_down`)."""
    _observed: tuple[Any, ...] | None = field(default=None, init=False, repr=False)
    _observed_at: float = field(default=0.0, init=False, repr=False)
    _renewed_at: float = field(default=0.0, init=False, repr=False)

    @property
    def holder(self) -> str | None:
        """The lease's holder as last read ("" for none; None before the
        first read)."""
        return self._observed[0] if self._observed is not None else None

    async def run(self) -> None:
        while True:
            try:
                held = await self._try_acquire_or_renew()
            except (TimeoutError, ApiException, OSError) as error:
                log.warning("lease %s: %s", self.name, error)
                held = False
            now = self.clock()
            held = held and self.competing  # a renewal that raced `step_down`: released next
            if held:
                self._renewed_at = now
                self._set_leader(True)
            elif self.is_leader and now - self._renewed_at >= self.settings.renew_deadline:
                log.warning("lease %s: not renewed within the deadline; stepping down", self.name)
                self._set_leader(False)
            await self.sleep(self.settings.retry_period)

    async def release(self) -> None:
        """Give the Lease up if we hold it (on shutdown)."""
        if not self.is_leader:
            return
        self._set_leader(False)
        try:
            lease = await self._read()
            if lease is not None:
                await self._give_up(lease)
        except (TimeoutError, ApiException, OSError) as error:
            log.warning("lease %s: release failed: %s", self.name, error)

    async def step_down(self) -> None:
        """Compete no more, and release the Lease now if held, so the next
        holder need not wait a lease duration. `run` goes on reading the
        Lease (and releasing it, should this release fail)."""
        self.competing = False
        await self.release()

    async def _give_up(self, lease: dict[str, Any]) -> None:
        if lease["spec"].get("holderIdentity") != self.identity:
            return
        now = micro_time(datetime.now(UTC))
        lease["spec"].update(
            holderIdentity="", leaseDurationSeconds=1, acquireTime=now, renewTime=now
        )
        if await self._replace(lease):
            log.info("lease %s: released by %s", self.name, self.identity)

    async def _try_acquire_or_renew(self) -> bool:
        lease = await self._read()
        now_time = micro_time(datetime.now(UTC))
        duration = max(1, math.ceil(self.settings.lease_duration))
        if lease is None and not self.competing:
            return False
        if lease is None:
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": duration,
                "acquireTime": now_time,
                "renewTime": now_time,
                "leaseTransitions": 0,
            }
            metadata = {"name": self.name, "namespace": self.namespace}
            if self.annotations:
                metadata["annotations"] = dict(self.annotations)  # type: ignore[assignment]
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": metadata,
                "spec": spec,
            }
            self.transitions = 0
            return await self._write(self.api.create_namespaced_lease, self.namespace, body)
        spec = lease.setdefault("spec", {})
        metadata = lease.setdefault("metadata", {})
        self.observed_annotations = dict(metadata.get("annotations") or {})
        self.transitions = spec.get("leaseTransitions") or 0
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if not self.competing:
            await self._give_up(lease)
            return False
        if holder == self.identity:
            spec.update(renewTime=now_time, leaseDurationSeconds=duration)
            self._annotate(metadata)
            return await self._replace(lease)
        if self.is_leader:
            log.warning("lease %s: taken over by %s", self.name, holder)
            self._set_leader(False)
        expired = now - self._observed_at >= (spec.get("leaseDurationSeconds") or duration)
        if holder and not expired:
            return False
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=duration,
            acquireTime=now_time,
            renewTime=now_time,
            leaseTransitions=(spec.get("leaseTransitions") or 0) + 1,
        )
        self._annotate(metadata)
        if not await self._replace(lease):
            return False
        self.transitions = spec["leaseTransitions"]
        return True

    def _annotate(self, metadata: dict[str, Any]) -> None:
        if self.annotations:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **self.annotations}
            self.observed_annotations = dict(metadata["annotations"])

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await call_json(self.api.read_namespaced_lease, self.name, self.namespace)
        except ApiException as error:
            if error.status == NOT_FOUND:
                return None
            raise

    async def _replace(self, lease: dict[str, Any]) -> bool:
        return await self._write(
            self.api.replace_namespaced_lease, self.name, self.namespace, lease
        )

    async def _write(self, func: Callable[..., Any], *args: Any) -> bool:
        try:
            await call_json(func, *args)
        except ApiException as error:
            if error.status == CONFLICT:
                return False
            raise
        return True

    def _set_leader(self, leader: bool) -> None:
        if leader == self.is_leader:
            return
        self.is_leader = leader
        log.info(
            "lease %s: %s is %s",
            self.name,
            self.identity,
            "the leader" if leader else "no longer the leader",
        )
        if self.on_change is not None:
            self.on_change(leader)
