"""A forwarding replica (`epp serve --decider HOST:PORT`): it serves
ext_proc for Envoy and leaves every decision to the pool's decider
(`epp.serve.decider`) over a gRPC stream (`epp.serve.replicas`). See
docs/operations/replicas.md.

`ReplicaAdmission` is the replica's `Admission`: a protocol worker's
(`RemoteAdmission`) whose link is the stream to the decider, and which
outlives it. What runs where is the replica's own state: when a decider
(re)joins it, the replica reports every request it has running (HELD) and
sends its undecided requests again, in the order degraded mode admits.

Degraded mode. After `DEGRADE_AFTER_S` without a frame from a decider the
replica admits on its own: each endpoint takes requests from it while it
runs fewer than its share there (`share(limit, replicas)`, of the limit
the decider last told it, else as its own configuration gives it), highest
priority first; within a band whose fairness policy is VTC, the flow with
the smallest counter, then oldest; the rest wait. A replica keeps VTC's
counters for its own traffic all the time, however decided (prompt tokens
at dispatch, output tokens at completion, the band's weights; a flow that
sends is lifted to the counter of the flow last dispatched), so degraded
mode goes on from the share each flow had through it. The decider keeps those shares aside while the
replica is away, so nothing overshoots. When a decider answers again, the
replica reports what it runs and decides nothing more on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import grpc

from epp.extproc.server import AdmissionDenied
from epp.flowcontrol.config import Fairness, FlowControlConfig
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.serve import wire
from epp.serve.replicas import (
    BEAT,
    BEAT_S,
    CHANNEL_OPTIONS,
    DEGRADE_AFTER_S,
    HELLO,
    JOINED,
    LIMITS,
    METHOD,
    RECONNECT_S,
    REPORTED,
    SEEN,
    TOLD,
    StreamLink,
    decode,
    held_fields,
    share,
)
from epp.serve.worker import RemoteAdmission

if TYPE_CHECKING:
    from epp.scheduling.core import Core
    from epp.serve.owner import Owner

log = logging.getLogger("epp.serve.replica")

LimitOf = Callable[[str], int | None]

PRUNE_AT = 1024
"""Flows counted (`ReplicaAdmission._charged`) past which those with
nothing here are forgotten (then again past twice what is left, plus this)."""


class ReplicaAdmission(RemoteAdmission):
    """See the module docstring. `decider` is the decider's HOST:PORT, or
    gives it at each attempt to reach it (cluster mode: from the Lease;
    None: not known yet); `endpoints` gives the pool's addresses now,
    `limit_of` an endpoint's in-flight limit (None: none), `flow_control`
    the flow-control configuration now, whose bands' fairness policies
    degraded mode follows (None: oldest first in every band)."""

    def __init__(
        self,
        replica_id: str,
        decider: str | Callable[[], str | None],
        replicas: int,
        endpoints: Callable[[], list[str]],
        limit_of: LimitOf,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        flow_control: Callable[[], FlowControlConfig] | None = None,
    ) -> None:
        super().__init__(None, seed)
        self.replica_id = replica_id
        self._decider = decider if callable(decider) else lambda: decider
        self.decider: str | None = None
        """The decider's address as last tried."""
        self.replicas = replicas
        self._pool = endpoints
        self._limit_of = limit_of
        self._clock = clock
        self.epoch = 0
        """The newest decider epoch this replica has seen."""
        self.joined = False
        self.degraded = False
        self.frames_refused = 0
        self.degraded_admissions = 0
        self.joins = 0
        self.told: dict[str, int] = {}
        """Each endpoint's limit as the decider last told it (LIMITS): its
        share is cut from it while degraded, and a new decider starts from it."""
        self.told_epoch = 0
        """The epoch of the decider that told them."""
        self._running: Counter[str] = Counter()
        """This replica's dispatched requests on each endpoint, however decided."""
        self._flow_control = flow_control
        self._weights_of: dict[int, tuple[float, float] | None] = {}
        """Each band's VTC weights (`_weights`) under `_weights_from`."""
        self._weights_from: FlowControlConfig | None = None
        self._charged: dict[tuple[int, str], float] = {}
        """VTC's counter of each flow (band, fairness id) of a VTC band, for
        what it sent through this replica, however decided: what degraded
        mode orders a band's waiting requests by."""
        self._floor: dict[int, float] = {}
        """Each band's counter of the flow last dispatched here, before its
        charge (VTC's floor): a flow that sends is lifted to it."""
        self._prune_at = PRUNE_AT
        self._last_heard = clock()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    def stats(self) -> Iterator[tuple[str, tuple[str, ...], float]]:
        """The replica's series (`epp.serve.metrics`)."""
        yield "epp_replica_degraded", (), float(self.degraded)
        yield "epp_replica_degraded_admissions_total", (), self.degraded_admissions
        yield "epp_replica_joins_total", (), self.joins
        yield "epp_replica_frames_refused_total", (), self.frames_refused

    # -- Admission ---------------------------------------------------------------

    def offer(self, request: FlowRequest) -> Outcome | None:
        if self._closing:
            return self._shut_out(request)
        if self.joined:
            return super().offer(request)
        rid = next(self._rids)
        self._requests[rid] = request
        self._rid_of[request] = rid
        self._lift(request)
        if self.degraded:
            return self._admit_here(request)
        return None  # sent when a decider joins, or admitted here once degraded

    # -- the stream to the decider -----------------------------------------------

    def start(self) -> None:
        # Silent from now, not from when it was built (workers take seconds to start).
        self._last_heard = self._clock()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._connect(), name="replica link"),
            loop.create_task(self._watch(), name="replica watch"),
        ]

    async def stop(self) -> None:
        self._closing = True
        if self._call is not None:
            self._call.cancel()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _connect(self) -> None:
        while not self._closing:
            self.decider = self._decider()
            if self.decider is None:
                await asyncio.sleep(RECONNECT_S)
                continue
            link = StreamLink(lambda: self.epoch, self._clock)
            link.send([HELLO, self.replica_id])
            try:
                async with grpc.aio.insecure_channel(
                    self.decider, options=CHANNEL_OPTIONS
                ) as channel:
                    call = self._call = channel.stream_stream(METHOD)(link.frames())
                    async for frame in call:
                        epoch, messages, _ = decode(frame)
                        if epoch < self.epoch:
                            self.frames_refused += 1
                            log.error(
                                "refused a frame of decider epoch %d: epoch %d is newer",
                                epoch,
                                self.epoch,
                            )
                            break
                        self.epoch = epoch
                        self._last_heard = self._clock()
                        self._on_frame(link, messages)
            except asyncio.CancelledError:
                if self._closing:
                    raise
                log.warning("the decider at %s stopped answering", self.decider)
            except (grpc.aio.AioRpcError, ValueError) as error:
                if self.joined and self.link is link:
                    log.warning("lost the decider at %s: %s", self.decider, type(error).__name__)
            finally:
                self._call = None
                link.close()
                if self.link is link:
                    self._parted()
            await asyncio.sleep(RECONNECT_S)

    async def _watch(self) -> None:
        """Beats to the decider; the end of a silent stream; degraded mode."""
        while True:
            await asyncio.sleep(BEAT_S)
            silent = self._clock() - self._last_heard
            if self.joined and self.link is not None:
                if silent > DEGRADE_AFTER_S and self._call is not None:
                    self._call.cancel()  # a decider that stopped answering
                else:
                    self.link.send([BEAT])
            if not self.joined and not self.degraded and silent > DEGRADE_AFTER_S:
                self._degrade(silent)

    def _on_frame(self, link: StreamLink, messages: list[wire.Message]) -> None:
        theirs = []
        for message in messages:
            kind = message[0]
            if kind == JOINED:
                self._joined(link)
            elif kind == LIMITS:
                self.told.update(message[2])
                self.told_epoch = self.epoch
                link.send([SEEN, message[1]])
            elif kind != BEAT:
                theirs.append(message)
        if theirs and self.link is link:
            self.on_messages(theirs)

    def _joined(self, link: StreamLink) -> None:
        """A decider decides for this replica: tell it what runs here, then
        what waits."""
        self.link = link  # type: ignore[assignment]
        self.joined = True
        self.joins += 1
        if self.degraded:
            self.degraded = False
            log.warning("epp replica %s rejoined the decider at %s", self.replica_id, self.decider)
        else:
            log.info("epp replica %s joined the decider at %s", self.replica_id, self.decider)
        waiting = []
        for rid, request in self._requests.items():
            if request.state is State.DISPATCHED:
                link.send(held_fields(rid, request))
            elif request.outcome is None:
                waiting.append((rid, request))
        link.send([TOLD, self.told_epoch, dict(self.told)])
        link.send([REPORTED])
        # In the order degraded mode would admit them: a new decider's VTC
        # counters all start level, and it takes level flows in the order
        # they came, so the flows this replica served least go first there.
        waiting.sort(key=lambda item: self._order(item[1]))
        for rid, request in waiting:
            link.send([wire.ARRIVE, rid, *wire.arrival_fields(request)])

    def _parted(self) -> None:
        self.link = None
        self.joined = False

    # -- degraded mode -------------------------------------------------------------

    def _degrade(self, silent: float) -> None:
        self.degraded = True
        log.warning(
            "epp replica %s runs degraded: no decider answered for %.1f s; admitting "
            "within its share (1/%d) of each endpoint's limit",
            self.replica_id,
            silent,
            self.replicas,
        )
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        waiting = [r for r in self._requests.values() if r.outcome is None]
        waiting.sort(key=self._order)
        for request in waiting:
            if self._admit_here(request) is None:
                return

    def _weights(self, priority: int) -> tuple[float, float] | None:
        """The input and output token weights of the band's VTC policy (None: not VTC)."""
        if self._flow_control is None:
            return None
        config = self._flow_control()
        if config is not self._weights_from:  # reloaded
            self._weights_from = config
            self._weights_of = {}
        try:
            return self._weights_of[priority]
        except KeyError:
            band = config.band(priority)
            weights = (
                (band.input_weight, band.output_weight) if band.fairness is Fairness.VTC else None
            )
            self._weights_of[priority] = weights
            return weights

    def _order(self, request: FlowRequest) -> tuple[int, float, float]:
        """Degraded mode's order: highest band, smallest counter, oldest."""
        return -request.priority, self._counter(request), request.arrival

    def _counter(self, request: FlowRequest) -> float:
        """The counter of `request`'s flow; one not counted (new, or
        forgotten) is at its band's floor."""
        priority = request.priority
        return self._charged.get((priority, request.fairness_id), self._floor.get(priority, 0.0))

    def _lift(self, request: FlowRequest) -> None:
        """As VTC lifts a flow that begins to send to the floor, so that it
        gets no credit for the time it sent nothing."""
        flow = (request.priority, request.fairness_id)
        counter = self._charged.get(flow)
        if counter is not None and counter < self._floor.get(request.priority, 0.0):
            del self._charged[flow]  # at the floor

    def _charge(self, request: FlowRequest, input_tokens: int, output_tokens: int) -> None:
        weights = self._weights(request.priority)
        if weights is None:
            return
        flow = (request.priority, request.fairness_id)
        charged = self._charged
        counter = self._counter(request)
        if input_tokens:
            self._floor[request.priority] = counter
        charged[flow] = counter + weights[0] * input_tokens + weights[1] * output_tokens
        if len(charged) > self._prune_at:
            # Forgotten, a flow with nothing here starts again at the floor
            # when it sends (as VTC forgets an idle flow after a while).
            active = {(r.priority, r.fairness_id) for r in self._requests.values()}
            self._charged = {k: c for k, c in charged.items() if k in active}
            self._prune_at = PRUNE_AT + 2 * len(self._charged)

    def _admit_here(self, request: FlowRequest) -> Outcome | None:
        """Dispatch `request` to the least busy endpoint where this replica
        runs less than its share; None (it waits) when none has room."""
        subset = request.payload.subset
        best: str | None = None
        for endpoint in self._pool():
            if subset is not None and endpoint not in subset:
                continue
            limit = self.told.get(endpoint)
            if limit is None:
                limit = self._limit_of(endpoint)
            running = self._running[endpoint]
            if limit is not None and running >= share(limit, self.replicas):
                continue
            if best is None or running < self._running[best]:
                best = endpoint
        if best is None:
            return None
        self.degraded_admissions += 1
        self._decided(
            self._rid_of[request],
            [Outcome.DISPATCHED.value, best, None, (), None, None, request.priority, None],
        )
        return request.outcome

    # -- bookkeeping -----------------------------------------------------------------

    def _decided(self, rid: int, fields: wire.Message) -> None:
        request = self._requests.get(rid)
        if request is None or request.outcome is not None:
            return  # decided here meanwhile (degraded), or withdrawn
        super()._decided(rid, fields)
        if request.state is State.DISPATCHED and request.endpoint is not None:
            self._running[request.endpoint] += 1
            self._charge(request, request.input_tokens, 0)

    def _complete(self, request: FlowRequest, fields: list[object]) -> None:
        if request.state is not State.DISPATCHED:
            return
        endpoint = request.endpoint or ""
        super()._complete(request, fields)
        self._running[endpoint] -= 1
        if self._running[endpoint] <= 0:
            del self._running[endpoint]
        output_tokens = fields[1]
        if isinstance(output_tokens, int) and output_tokens:
            self._charge(request, 0, output_tokens)
        if self.degraded:
            self._admit_waiting()

    def on_lost(self) -> None:
        """A replica outlives its decider's streams (`_parted`)."""


class Relay:
    """What a forwarding replica's core owner drives under `--workers`
    (`epp.serve.owner.Decides`): its workers' requests go to the decider
    through the replica's `ReplicaAdmission`, as the in-process ext_proc
    service's do, and each decision (or degraded mode's) back to the
    request's worker (`Owner.decided`, `Owner.refused`). The decider screens
    every request, so nothing is screened here; `core` is this process's
    own (its prefix scorer's geometry, which the workers hash prompts with)."""

    __slots__ = ("_owner", "core", "replica")

    def __init__(self, replica: ReplicaAdmission, core: Core, owner: Owner) -> None:
        self.replica = replica
        self.core = core
        self._owner = owner
        replica.on_settled = self._settled
        replica.on_evict = owner.evict

    def screen(self, request: FlowRequest) -> str | None:
        return None

    def offer(self, request: FlowRequest) -> Outcome | None:
        return self.replica.offer(request)  # its decision goes out through `_settled`

    def complete(
        self, request: FlowRequest, usage: Usage | None = None, itl: float | None = None
    ) -> None:
        self.replica.complete(request, usage, itl)

    def withdraw(self, request: FlowRequest) -> None:
        self.replica.withdraw(request)

    def first_token(self, request: FlowRequest) -> None:
        self.replica.first_token(request)

    def prefill_done(self, request: FlowRequest) -> None:
        self.replica.prefill_done(request)

    def poke(self) -> None:
        """The decider's core decides: a read here frees nothing."""

    def _settled(self, request: FlowRequest, error: Exception | None) -> None:
        owner = self._owner
        if error is None:
            owner.decided(request, time.monotonic())
        else:
            owner.refused(request, error.reason if isinstance(error, AdmissionDenied) else None)
        # The worker answers one not dispatched: the decider forgets it now.
        self.replica.done_undispatched(request)
