"""The decider of a pool's replicas (`epp serve --decider-port PORT`): the
one replica whose `Core` decides for all of them. See
docs/operations/replicas.md and the protocol in `epp.serve.replicas`.

    replica (epp serve --decider HOST:PORT) --gRPC bidi stream--> Decider
        -> Owner.on_messages (as a protocol worker's link) -> AdmissionController -> Core

Each replica's stream is a `WorkerSlot` of an `Owner` that has no worker
processes: its arrivals, completions, first tokens and cancels are the
same `AdmissionController` calls a worker's are, and decisions go back
through the same `Owner.decided`, so the decider decides for a replica
exactly as a core owner does for its workers.

What is in flight where is the replicas' state. A replica that (re)joins
reports each request it has running (HELD), which the decider adopts
(`AdmissionController.adopt`: the credit held, nothing placed).

Shares. While a replica is away (its stream ended or fell silent), it may
admit on its own within `share(limit, replicas)` of each endpoint, so the
decider keeps aside, on each endpoint, the larger of that share and what
the replica held there when it went (placeholder requests adopted at the
endpoint, completed when the replica reports again). A decider that starts
keeps a share aside for each replica that has not reported yet (in cluster
mode its own replica too, whose requests come over loopback). A share is
cut from the learned limit the replica was last told (LIMITS), the largest
it may hold (`LimitsTold`). So what away replicas use and what the decider
hands out never sum past an endpoint's limit as it was when they went.

Soft state. The learned limits are carried across a change of decider
through the replicas: a joining replica reports the ones it was told
(TOLD), and a new decider starts its adaptive gate from the first report
of an older epoch (`seed`). Fairness counters and what the scorers learn
from picks start afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING

import grpc

from epp.flowcontrol.request import FlowRequest, State
from epp.scheduling.request import InferenceRequest
from epp.serve import wire
from epp.serve.admission import AdmissionController
from epp.serve.inputs import StartupError
from epp.serve.owner import Owner, WorkerSlot
from epp.serve.replicas import (
    AWAY_AFTER_S,
    BEAT,
    BEAT_S,
    CHANNEL_OPTIONS,
    HELD,
    HELLO,
    JOINED,
    LIMITS,
    MAX_UNSEEN_LIMITS,
    REPORTED,
    SEEN,
    SERVICE,
    TOLD,
    ClockOffset,
    LimitsTold,
    StreamLink,
    decode,
    share,
)

if TYPE_CHECKING:
    from epp.k8s.cluster import ClusterMode

log = logging.getLogger("epp.serve.decider")
decisions = logging.getLogger("epp.serve.decider.decisions")
"""At debug: one line per decision (`Decider.decided`), for merged logs."""

LimitOf = Callable[[str], int | None]
"""An endpoint's in-flight limit now (None: the gate sets it none)."""


@dataclass(slots=True, eq=False)
class Replica:
    """A replica the decider has heard from, by its id."""

    id: str
    slot: WorkerSlot | None = None
    """Its stream while it is joined; None while it is away."""
    last_heard: float = 0.0
    kept_aside: list[FlowRequest] = field(default_factory=list)
    """Placeholders holding its share while it is away."""
    reported: bool = False
    joins: int = 0
    limits: LimitsTold = field(default_factory=LimitsTold)
    """The limits it holds, or may (its degraded share is cut from them)."""
    joined_at_seq: int = 0
    """The last LIMITS sequence number before its current stream began."""


class Decider:
    """See the module docstring. `replicas` counts every replica of the pool,
    this one included; `endpoints` gives the pool's addresses now."""

    def __init__(
        self,
        owner: Owner,
        priority_of: Callable[[Mapping[str, str]], int],
        replicas: int,
        limit_of: LimitOf,
        endpoints: Callable[[], list[str]],
        epoch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.owner = owner
        self.epoch = epoch if epoch is not None else time.time_ns()
        self.replicas = replicas
        self._priority_of = priority_of
        self._limit_of = limit_of
        self._endpoints = endpoints
        self._clock = clock
        self._known: dict[str, Replica] = {}
        self._unreported: list[list[FlowRequest]] = []
        """A share set aside for each replica not heard from since this decider started."""
        self._slots = count(1)
        self._placeholders = count()
        self._limit_seq = 0
        """The sequence number of the last LIMITS sent (to any replica)."""
        self.seeded = False
        """Whether this decider's adaptive gate started from limits a
        previous decider learned (a replica's TOLD, or this one's own)."""
        self._server: grpc.aio.Server | None = None
        self._beat: asyncio.Task[None] | None = None
        self.frames_refused = 0
        self._received: dict[str, float] = {}
        """When each undecided replica request arrived here (with `decisions` at debug)."""
        self.leading = False
        """Whether replicas are served (a stream from a replica is refused otherwise)."""

    @property
    def admission(self) -> AdmissionController:
        admission = self.owner.admission
        assert admission is not None
        return admission

    def stats(self) -> Iterator[tuple[str, tuple[str, ...], float]]:
        """The decider's series (`epp.serve.metrics`)."""
        joined = sum(1 for r in self._known.values() if r.slot is not None)
        yield "epp_decider_replicas", ("joined",), joined
        yield "epp_decider_replicas", ("away",), len(self._known) - joined
        yield "epp_decider_epoch", (), self.epoch
        yield "epp_replica_frames_refused_total", (), self.frames_refused

    def has_reported(self, replica_id: str) -> bool:
        """Whether replica `replica_id` has reported what it runs to this decider."""
        known = self._known.get(replica_id)
        return known is not None and known.reported

    def decided(self, request: FlowRequest, now: float) -> bool:
        """`on_outcome`: the decision goes to its replica (`Owner.decided`);
        with `decisions` at debug, a line with the request's priority, when
        this decider received it (a replica's ARRIVE; its own requests:
        their arrival) and when it decided. False: the outcome series are
        this page's (a replica records none of them)."""
        if decisions.isEnabledFor(logging.DEBUG):
            received = self._received.pop(request.request_id, request.arrival)
            decisions.debug(
                "decision %s priority %d received %.6f decided %.6f outcome %s endpoint %s",
                request.request_id,
                request.priority,
                received,
                self._clock(),
                request.outcome.value if request.outcome is not None else None,
                request.endpoint,
            )
        return self.owner.decided(request, now)

    # -- running ---------------------------------------------------------------

    def lead(
        self,
        epoch: int,
        forwarded_here: bool = False,
        told: tuple[int, Mapping[str, int]] | None = None,
    ) -> None:
        """Decide from now on, writing `epoch`. `forwarded_here`: this
        process's own requests come over a stream too (cluster mode, the
        Lease won), so every replica's share is set aside until it reports,
        else every other replica's. `told`: the limits this process's own
        replica was last told, and the epoch that told them (`seed`)."""
        self.resign()
        for replica in self._known.values():
            self._release(replica.kept_aside)
        self._known.clear()
        for kept in self._unreported:
            self._release(kept)
        self.epoch = epoch
        self.leading = True
        self.seeded = False
        unreported = self.replicas if forwarded_here else self.replicas - 1
        self._unreported = [[] for _ in range(unreported)]
        if told is None or not self.seed(*told):
            self._unreported = [self._keep_aside("unreported", {}) for _ in range(unreported)]
        log.info("epp decider leading (epoch %d)", epoch)

    def seed(self, epoch: int, limits: Mapping[str, int]) -> bool:
        """Soft state across a change of decider: start the adaptive gate
        from `limits`, learned by the decider of `epoch`, once, if that one
        came before this one. The shares of replicas that have not reported
        are cut from them too, as those replicas hold the same ones. Whether
        it seeded."""
        if self.seeded or not limits or epoch >= self.epoch:
            return False
        self.seeded = True
        seeded = self._told_else_own(limits.get)
        # the new shares are held before the old go and before the limits
        # move, so no dispatch meanwhile finds room that is theirs
        unreported = [self._keep_aside("unreported", {}, seeded) for _ in self._unreported]
        for kept in self._unreported:
            self._release(kept)
        self._unreported = unreported
        self.admission.seed_limits(limits)
        log.info("epp decider starts from %d learned limits of epoch %d", len(limits), epoch)
        return True

    def resign(self) -> None:
        """Decide nothing more for the replicas (the Lease was lost, or this
        process drains): every replica's stream ends, first of all so that
        no decision leaves any more, then each counts as away. What they
        hold stays kept aside here, since they run it on and admit within
        their shares meanwhile: what this core still dispatches (its own
        queue, while it drains) never sums past a limit with theirs. They
        report to the next decider."""
        if not self.leading:
            return
        self.leading = False
        joined = [(r, r.slot) for r in self._known.values() if r.slot is not None]
        for _, slot in joined:
            if slot.link is not None:
                slot.link.close()
        for replica, slot in joined:
            self._away(replica, slot)
        log.warning("epp decider resigned (epoch %d)", self.epoch)

    async def start(self, host: str, port: int, leading: bool = True) -> int:
        """Serve replicas on `port` (0: a free one); the port bound. With
        `leading` it decides at once (file mode); else from `lead`."""
        # no SO_REUSEPORT: a second decider on the port must fail, not share it
        server = self._server = grpc.aio.server(
            options=(*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0))
        )
        handler = grpc.stream_stream_rpc_method_handler(self._link)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Link": handler}),)
        )
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            raise StartupError(
                f"--decider-port {port}: cannot listen on {host}:{port} (in use?)"
            ) from None
        await server.start()
        if leading:
            self.lead(self.epoch)
        self._beat = asyncio.get_running_loop().create_task(self._beats(), name="decider beats")
        log.info("epp decider port %d (%d replicas)", bound, self.replicas)
        return bound

    async def stop(self) -> None:
        self.resign()
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self._server is not None:
            await self._server.stop(0.5)

    async def _beats(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            now = self._clock()
            limits: dict[str, int] | None = None
            for replica in list(self._known.values()):
                slot = replica.slot
                if slot is None or slot.link is None:
                    continue
                link = slot.link
                if now - replica.last_heard > AWAY_AFTER_S:
                    log.warning("epp replica %s silent for %.1f s", replica.id, AWAY_AFTER_S)
                    self._away(replica, slot)
                    link.close()
                    continue
                if limits is None:
                    limits = self._limits_now()
                changed = replica.limits.changes(limits)
                if not changed:
                    link.send([BEAT])
                elif len(replica.limits.sending) >= MAX_UNSEEN_LIMITS:
                    log.warning("epp replica %s acknowledges no LIMITS: stream ended", replica.id)
                    self._away(replica, slot)
                    link.close()
                else:
                    self._limit_seq += 1
                    replica.limits.sent(self._limit_seq, changed)
                    link.send([LIMITS, self._limit_seq, changed])

    def _limits_now(self) -> dict[str, int]:
        limits = {}
        for endpoint in self._endpoints():
            limit = self._limit_of(endpoint)
            if limit is not None:
                limits[endpoint] = limit
        return limits

    # -- a replica's stream ------------------------------------------------------

    async def _link(
        self, frames: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        link = StreamLink(lambda: self.epoch)
        reader = asyncio.get_running_loop().create_task(self._read(frames, link))
        try:
            async for frame in link.frames():
                yield frame
        finally:
            link.close()
            reader.cancel()

    async def _read(self, frames: AsyncIterator[bytes], link: StreamLink) -> None:
        replica: Replica | None = None
        slot: WorkerSlot | None = None
        offset = ClockOffset()
        try:
            async for frame in frames:
                epoch, messages, stamp = decode(frame)
                if stamp is not None:
                    offset.sample(self._clock(), stamp)
                offset.translate(messages)
                if epoch > self.epoch:
                    self.frames_refused += 1
                    log.error(
                        "a replica has seen epoch %d, newer than this decider's %d: "
                        "this decider is deposed",
                        epoch,
                        self.epoch,
                    )
                    return
                if replica is None:
                    if not self.leading:
                        return  # not the decider (now): the replica asks the Lease again
                    if not messages or messages[0][0] != HELLO:
                        log.warning("a replica stream did not begin with HELLO")
                        return
                    replica, slot = self._hello(str(messages[0][1]), link)
                    messages = messages[1:]
                replica.last_heard = self._clock()
                if replica.slot is not slot:
                    return  # this stream was replaced or counted away
                self._on_messages(replica, slot, messages)
        except ValueError as error:
            log.warning("replica stream ended: %s", error)
        except grpc.aio.AioRpcError:
            pass
        finally:
            link.close()
            if replica is not None and slot is not None:
                self._away(replica, slot)

    def _hello(self, replica_id: str, link: StreamLink) -> tuple[Replica, WorkerSlot]:
        replica = self._known.get(replica_id)
        if replica is None:
            replica = self._known[replica_id] = Replica(replica_id)
        elif replica.slot is not None:
            old = replica.slot
            self._away(replica, old)
            if old.link is not None:
                old.link.close()
        slot = WorkerSlot(next(self._slots))
        slot.link = link  # type: ignore[assignment]
        replica.slot = slot
        replica.joins += 1
        replica.joined_at_seq = self._limit_seq
        replica.last_heard = self._clock()
        self.owner.join(slot)
        link.send([JOINED])
        log.info("epp replica %s joined (epoch %d)", replica_id, self.epoch)
        return replica, slot

    def _on_messages(
        self, replica: Replica, slot: WorkerSlot, messages: list[wire.Message]
    ) -> None:
        run: list[wire.Message] = []
        logging_decisions = decisions.isEnabledFor(logging.DEBUG)
        for message in messages:
            kind = message[0]
            if kind == wire.ARRIVE and logging_decisions:
                # stamped as it reaches the core: what came before it in the frame is done
                if run:
                    self.owner.on_messages(slot, run)
                    run = []
                self._received[message[2]] = self._clock()
                self.owner.on_messages(slot, [message])
                continue
            if kind < HELLO:
                run.append(message)
                continue
            if run:
                self.owner.on_messages(slot, run)
                run = []
            if kind == HELD:
                self._adopt(slot, message[1], message[2], message[3:])
            elif kind == SEEN:
                replica.limits.seen(int(message[1]))
            elif kind == TOLD:
                told = {str(e): int(limit) for e, limit in dict(message[2]).items()}
                replica.limits.reported(told, replica.joined_at_seq)
                self.seed(int(message[1]), told)
            elif kind == REPORTED:
                self._reported(replica)
        if run:
            self.owner.on_messages(slot, run)

    def _adopt(self, slot: WorkerSlot, rid: int, endpoint: str, fields: wire.Message) -> None:
        request = wire.request_from_fields(fields, self._priority_of)
        slot.requests[rid] = request
        self.admission.adopt(request, endpoint)

    def _reported(self, replica: Replica) -> None:
        """Every request the replica runs is held here now: its share is not kept aside."""
        self._release(replica.kept_aside)
        replica.kept_aside = []
        if not replica.reported and self._unreported:
            self._release(self._unreported.pop())
        replica.reported = True

    def _away(self, replica: Replica, slot: WorkerSlot) -> None:
        """The replica's stream ended: keep its share aside, then withdraw
        what it held through this stream (in that order, so its endpoints
        never look emptier than they are)."""
        if replica.slot is not slot:
            return
        replica.slot = None
        held = Counter(
            request.endpoint
            for request in slot.requests.values()
            if request.state is State.DISPATCHED and request.endpoint is not None
        )
        self._release(replica.kept_aside)
        replica.kept_aside = self._keep_aside(
            replica.id, held, self._told_else_own(replica.limits.most)
        )
        self.owner.detach(slot)
        log.warning(
            "epp replica %s away: %d in flight there; its share of %d endpoints kept aside",
            replica.id,
            sum(held.values()),
            len({r.endpoint for r in replica.kept_aside}),
        )

    # -- shares -----------------------------------------------------------------

    def _told_else_own(self, told: LimitOf) -> LimitOf:
        """Each endpoint's limit as `told` gives it, else as this decider's."""

        def limit_of(endpoint: str) -> int | None:
            limit = told(endpoint)
            return limit if limit is not None else self._limit_of(endpoint)

        return limit_of

    def _keep_aside(
        self,
        replica_id: str,
        held: Mapping[str | None, int],
        limit_of: LimitOf | None = None,
    ) -> list[FlowRequest]:
        """Placeholders holding, on each endpoint, the larger of a replica's
        share (of `limit_of`, the limit it cuts its share from; by default
        this decider's) and what it `held` there."""
        admission = self.admission
        now = self._clock()
        limit_of = limit_of or self._limit_of
        placeholders = []
        for endpoint in self._endpoints():
            limit = limit_of(endpoint)
            if limit is None:
                continue
            for _ in range(max(share(limit, self.replicas), held.get(endpoint, 0))):
                placeholder = FlowRequest(
                    f"kept-aside/{replica_id}/{next(self._placeholders)}",
                    f"replica-{replica_id}",
                    0,
                    now,
                    payload=InferenceRequest(model="", target_model=""),
                )
                admission.adopt(placeholder, endpoint)
                placeholders.append(placeholder)
        return placeholders

    def _release(self, placeholders: list[FlowRequest]) -> None:
        admission = self.admission
        for placeholder in placeholders:
            admission.complete(placeholder)


DECIDER_ANNOTATION = "llm-d.ai/epp-decider"
"""The Lease annotation where its holder writes its decider's HOST:PORT."""


def follow_lease(
    decider: Decider,
    mode: ClusterMode,
    address: str,
    told: Callable[[], tuple[int, Mapping[str, int]]] | None = None,
) -> None:
    """Cluster mode: `decider` decides while this replica holds the pool's
    Lease, with the Lease's transitions as its epoch, and writes `address`
    on the Lease for the other replicas. `told`: this replica's last told
    limits and their epoch, which a new holder starts from (`Decider.seed`)."""
    elector = mode.elector
    assert elector is not None
    elector.annotations[DECIDER_ANNOTATION] = address

    def lead() -> None:
        decider.lead(elector.transitions, True, told() if told is not None else None)

    def leadership(leading: bool) -> None:
        if leading:
            lead()
        else:
            decider.resign()

    mode.leadership_listeners.append(leadership)
    if elector.is_leader:
        lead()


def lease_decider(mode: ClusterMode | None) -> str | None:
    """The decider's HOST:PORT as the Lease last read names it (None: no
    holder, or not read yet)."""
    elector = mode.elector if mode is not None else None
    if elector is None or not elector.holder:
        return None
    return elector.observed_annotations.get(DECIDER_ANNOTATION)
