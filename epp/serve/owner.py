"""The core owner of `epp serve --workers N`: the one process that decides,
with N protocol workers (`epp.serve.worker`) doing the ext_proc work. See
docs/operations/workers.md.

    Envoy --TCP--> owner's ext_proc port --accept, hand the socket over
                   (SCM_RIGHTS, round robin)--> worker i: TLS, HTTP/2, ext_proc,
                                                parsing
    worker i <--frames (epp.serve.wire)--> Owner --> AdmissionController --> Core

`Owner` calls the `AdmissionController` exactly as the in-process
`ExtProcService` does, one message at a time, in the order the worker sent
them: an arrival is screened by the admitters, then offered; a completion,
first token, end of prefill or cancel is the same call. Decisions go back
through the controller's `on_outcome`, so a request decided at once and one
dispatched later from its queue take the same path. Each request is known
by (worker, rid) until the worker's last message about it.

A worker that dies (its link closes) has each of its requests withdrawn:
a queued one leaves its queue, a dispatched one completes, so its credits
return once; the worker is started again after `RESTART_DELAY_S`.
Connections go round robin to the live workers; with none, a connection
is closed at once (Envoy retries it). With `scrapes` set, the live workers
read the model servers' metrics pages and the owner applies each read
(`epp.serve.scrapes`); a worker's death or start reassigns the shares.
The workers record the stream side of the request metrics, and with
`outcomes` set the outcome series too, from the fields each DECISION
carries (`RequestMetrics.outcome_fields`: the owner keeps only its queue
gauges); their series are added to the owner's (`series`, asked for by
`gather` when the page is read, and sent each second).

In a forwarding replica (`epp.serve.replica`) the owner drives a `Relay`
instead: the same calls go to the replica's stream to its decider, and the
decisions come back through `decided` and `refused` when the decider (or
degraded mode) makes them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pickle
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.cache_scorers import PrefixCacheScorer
from epp.scheduling.core import Core
from epp.scheduling.scheduler import Scheduler
from epp.serve import wire
from epp.serve.metrics.recorder import OutcomeFields
from epp.serve.metrics.shipping import Merge
from epp.serve.scrapes import ScrapeShares
from epp.serve.tokenizer import CacheUse, TokenizerStats
from epp.serve.worker import WorkerSpec

log = logging.getLogger("epp.serve.owner")

RESTART_DELAY_S = 0.5
"""How long after a worker's death it is started again."""
START_TIMEOUT_S = 60.0
"""How long `start` waits for every worker to serve."""
STOP_WAIT_S = 10.0
"""How long a stopping worker gets to exit before it is killed."""
PULL_TIMEOUT_S = 0.5
"""How long a read of the metrics page waits for the workers' series."""
LISTEN_BACKLOG = 1024


class Decides(Protocol):
    """What the owner drives with its workers' messages: the in-process
    `AdmissionController`, or in a forwarding replica the stream to its
    decider (`epp.serve.replica.Relay`), which tells the owner of each
    decision through `decided` and `refused`."""

    @property
    def core(self) -> Core: ...

    def screen(self, request: FlowRequest) -> str | None: ...

    def offer(self, request: FlowRequest) -> Outcome | None: ...

    def complete(
        self, request: FlowRequest, usage: Usage | None = None, itl: float | None = None
    ) -> None: ...

    def withdraw(self, request: FlowRequest) -> None: ...

    def first_token(self, request: FlowRequest) -> None: ...

    def prefill_done(self, request: FlowRequest) -> None: ...

    def poke(self) -> None: ...


class Outcomes(Protocol):
    """Where a request's outcome series are recorded (`RequestMetrics`):
    `outcome_fields` here, at the decision; `record_outcome` from them, in
    the request's worker (or here, when its DECISION cannot reach it)."""

    def outcome_fields(self, request: FlowRequest, now: float) -> OutcomeFields | None: ...

    def record_outcome(self, request: FlowRequest, fields: OutcomeFields) -> None: ...


@dataclass(slots=True, eq=False)
class WorkerSlot:
    """One worker: its process, its link and the requests it holds here."""

    index: int
    link: wire.Link | None = None
    handoff: socket.socket | None = None
    process: asyncio.subprocess.Process | None = None
    requests: dict[int, FlowRequest] = field(default_factory=dict)
    recorded: dict[int, OutcomeFields] = field(default_factory=dict)
    """The outcome fields sent with each decision here until the request's
    last message (a CANCEL that crossed its DECISION: recorded here)."""
    arrivals: int = 0
    """Requests that arrived through this worker (all its processes)."""
    connections: int = 0
    """Connections handed to this worker (all its processes)."""
    restarts: int = 0
    open_connections: int = 0
    """The worker process's open connections, as it last said."""
    trips: dict[str, int] = field(default_factory=dict)
    """Its process's limit trips, as it last said."""
    trips_before: collections.Counter[str] = field(default_factory=collections.Counter)
    """The limit trips of its processes that died."""
    caches: dict[str, list[int]] = field(default_factory=dict)
    """Its process's token producer caches, [entries, capacity, dropped] by
    name, as it last said (TOKENIZED)."""
    dropped_before: collections.Counter[str] = field(default_factory=collections.Counter)
    """What the caches of its processes that died dropped, by name."""
    pulled: int = -1
    """The last PULL its process answered."""
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when its process answers a PULL."""

    serving: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when this worker process said it serves; cleared when it is gone."""

    @property
    def live(self) -> bool:
        return self.link is not None and not self.link.closed and self.serving.is_set()


class WorkersTransport:
    """The workers' ext_proc port as one, for the transport series: limit
    trips summed over every worker process, open connections over the live."""

    __slots__ = ("_slots",)

    def __init__(self, slots: list[WorkerSlot]) -> None:
        self._slots = slots

    @property
    def trips(self) -> collections.Counter[str]:
        total: collections.Counter[str] = collections.Counter()
        for slot in self._slots:
            total.update(slot.trips_before)
            total.update(slot.trips)
        return total

    @property
    def open_connections(self) -> int:
        return sum(slot.open_connections for slot in self._slots)


class Owner:
    """See the module docstring. `spec(index, control_fd, handoff_fd)` is
    the `WorkerSpec` of a worker about to start."""

    def __init__(
        self,
        workers: int,
        spec: Callable[[int, int, int], WorkerSpec],
        priority_of: Callable[[Mapping[str, str]], int],
        series: Merge | None = None,
        outcomes: Outcomes | None = None,
    ) -> None:
        self.admission: Decides | None = None
        self.priority_in_body: Callable[[FlowRequest], int | None] | None = None
        """Set (`requestHandler.propagatePriority`): each dispatched
        request's forwarded body priority, sent with its DECISION."""
        self.tokenizer = TokenizerStats(caches=self._token_caches)
        """What the workers' token producers counted, summed (TOKENIZED)."""
        self.scrapes: ScrapeShares | None = None
        """Set before `start` when the workers read the model servers' metrics."""
        self.slots = [WorkerSlot(index) for index in range(workers)]
        self.transport = WorkersTransport(self.slots)
        self._spec = spec
        self._priority_of = priority_of
        self._series = series
        """Where the workers' stream-side series are added (None: dropped)."""
        self._outcomes = outcomes
        """None: the outcome series are recorded by whoever records the rest."""
        self._pulls = 0
        self._origin: dict[FlowRequest, tuple[WorkerSlot, int]] = {}
        self._health: dict[str, int] = {}
        self._endpoints: list[str] = []
        self._models: bytes | None = None
        """The models-responder's answer the workers were last sent."""
        self._geometry: tuple[int, int] | None = None
        self._scheduler: Scheduler | None = None
        self._scorer: PrefixCacheScorer | None = None
        """The first prefix scorer of `_scheduler`, whose geometry the workers hash with."""
        self._listener: socket.socket | None = None
        self._next = 0
        self._stopping = False
        self._watches: set[asyncio.Task[None]] = set()

    def counts(self) -> Iterator[tuple[str, int, int, int]]:
        """(worker, requests, connections, restarts) of each worker, for the metrics."""
        for slot in self.slots:
            yield str(slot.index), slot.arrivals, slot.connections, slot.restarts

    # -- the core's side ---------------------------------------------------------------

    def decided(self, request: FlowRequest, now: float) -> bool:
        """`on_outcome`: tell the request's worker what the core decided;
        True when the worker records its outcome series."""
        origin = self._origin.get(request)
        if origin is None:
            return False
        slot, rid = origin
        if slot.link is None:
            return False
        decision = [wire.DECISION, rid, *wire.decision_fields(request, self.priority_in_body)]
        outcomes = self._outcomes
        fields = outcomes.outcome_fields(request, now) if outcomes is not None else None
        if fields is None:
            slot.link.send(decision)
            return False
        slot.recorded[rid] = fields
        decision.append(fields)
        slot.link.send(decision)
        return True

    def refused(self, request: FlowRequest, reason: str | None) -> None:
        """Tell the request's worker it was denied for `reason` (an admitter's,
        answered as a local denial), or with None that admission failed (500)."""
        origin = self._origin.get(request)
        if origin is None or origin[0].link is None:
            return
        slot, rid = origin
        if reason is not None:
            slot.link.send([wire.DENIED, rid, reason, request.priority])  # type: ignore[union-attr]
            return
        failed = [None, None, None, None, None, None, request.priority, None]
        slot.link.send([wire.DECISION, rid, *failed])  # type: ignore[union-attr]

    def evict(self, request: FlowRequest) -> None:
        """`Core.on_evict`: the worker ends the stream and then completes it."""
        origin = self._origin.get(request)
        if origin is not None and origin[0].link is not None:
            origin[0].link.send([wire.EVICT, origin[1]])

    def publish_health(self, service: str, status: int) -> None:
        self._health[service] = status
        for slot in self.slots:
            if slot.link is not None:
                slot.link.send([wire.READY, service, status])

    def publish_endpoints(self, addresses: list[str]) -> None:
        self._endpoints = addresses
        for slot in self.slots:
            if slot.link is not None:
                slot.link.send([wire.ENDPOINTS, addresses])
        self._assign_scrapes()

    def publish_models(self, answer: bytes | None) -> None:
        """The models-responder's answer now: sent to the workers when it changed."""
        if answer == self._models:
            return
        self._models = answer
        for slot in self.slots:
            if slot.link is not None:
                slot.link.send(self._models_message())

    def _models_message(self) -> wire.Message:
        return [wire.MODELS, self._models.decode() if self._models is not None else None]

    def _assign_scrapes(self) -> None:
        if self.scrapes is not None:
            self.scrapes.assign([(s.index, s.link) for s in self.slots if s.live])  # type: ignore[misc]

    # -- a worker's messages ----------------------------------------------------------

    def on_messages(self, slot: WorkerSlot, messages: list[wire.Message]) -> None:
        admission = self.admission
        assert admission is not None
        requests = slot.requests
        scrapes = self.scrapes
        looks = False
        for message in messages:
            kind = message[0]
            if kind == wire.ARRIVE:
                self._arrive(slot, message[1], message[2:])
                continue
            if kind == wire.FRESH or kind == wire.METRICS or kind == wire.SCRAPE_FAILED:
                if scrapes is not None and scrapes.apply(slot.index, message):
                    looks = True
                continue
            if kind == wire.TOKENIZED:
                self.tokenizer.tokenized += message[1]
                self.tokenizer.fallbacks.update(message[2])
                slot.caches = message[3]
                continue
            if kind == wire.TRANSPORT:
                slot.open_connections, slot.trips = message[1], message[2]
                continue
            if kind == wire.SERVING:
                slot.serving.set()
                self._assign_scrapes()
                continue
            if kind == wire.SERIES:
                if self._series is not None:
                    self._series.add(slot.index, message[2])
                if message[1] is not None:
                    slot.pulled = message[1]
                    slot.answered.set()
                continue
            rid = message[1]
            request = requests.get(rid)
            if request is None:
                continue
            if kind == wire.COMPLETE:
                self._forget(slot, rid)
                admission.complete(request, wire.usage_from(message[2], message[3]), message[4])
            elif kind == wire.REJECTED:
                if request.state is not State.DISPATCHED:
                    self._forget(slot, rid)
            elif kind == wire.FIRST_TOKEN:
                admission.first_token(request)
            elif kind == wire.PREFILL_DONE:
                admission.prefill_done(request)
            elif kind == wire.CANCEL:
                fields = slot.recorded.get(rid)
                if fields is not None and self._outcomes is not None:
                    # Its DECISION crossed this: the worker no longer knows the request.
                    self._outcomes.record_outcome(request, fields)
                self._forget(slot, rid)
                admission.withdraw(request)
        if looks:
            admission.poke()
        self._publish_geometry(admission)

    async def gather(self) -> None:
        """Have every live worker send its series now (the metrics page is
        read): back when all answered or after `PULL_TIMEOUT_S`."""
        self._pulls += 1
        pull = self._pulls
        asked = [slot for slot in self.slots if slot.live and slot.link is not None]
        for slot in asked:
            slot.answered.clear()
            slot.link.send([wire.PULL, pull])  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PULL_TIMEOUT_S
        for slot in asked:
            while slot.pulled < pull and slot.live:
                left = deadline - loop.time()
                if left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(slot.answered.wait(), left)
                slot.answered.clear()

    def _publish_geometry(self, admission: Decides) -> None:
        """Tell the workers how the prefix scorer hashes prompts now, when that changed."""
        scheduler = admission.core.scheduler
        if scheduler is not self._scheduler:
            self._scheduler = scheduler
            plugins = scheduler.plugins.values() if scheduler is not None else ()
            self._scorer = next((p for p in plugins if isinstance(p, PrefixCacheScorer)), None)
        geometry = self._scorer.geometry() if self._scorer is not None else None
        if geometry != self._geometry:
            self._geometry = geometry
            for slot in self.slots:
                if slot.link is not None:
                    slot.link.send([wire.GEOMETRY, *(geometry or (0, 0))])

    def _arrive(self, slot: WorkerSlot, rid: int, fields: wire.Message) -> None:
        admission = self.admission
        assert admission is not None and slot.link is not None
        request = wire.request_from_fields(fields, self._priority_of)
        slot.arrivals += 1
        slot.requests[rid] = request
        self._origin[request] = (slot, rid)
        try:
            denial = admission.screen(request)
            if denial is not None:
                self.refused(request, denial)
                return
            admission.offer(request)  # the decision goes out through `decided`
        except Exception:
            log.exception("admission failed for request %s", request.request_id)
            self.refused(request, None)

    def _forget(self, slot: WorkerSlot, rid: int) -> None:
        slot.recorded.pop(rid, None)
        request = slot.requests.pop(rid, None)
        if request is not None:
            self._origin.pop(request, None)

    def _token_caches(self) -> dict[str, CacheUse]:
        """The workers' token producer caches, summed: each holds its own."""
        total: dict[str, CacheUse] = {}
        for slot in self.slots:
            for name, dropped in slot.dropped_before.items():
                total.setdefault(name, CacheUse(0, 0, 0)).dropped += dropped
            for name, (entries, capacity, dropped) in slot.caches.items():
                use = total.setdefault(name, CacheUse(0, 0, 0))
                use.entries += entries
                use.capacity += capacity
                use.dropped += dropped
        return total

    def _lost(self, slot: WorkerSlot) -> None:
        """The worker's link closed: what it held ends here, credits returned
        once. Not when the owner stops: a worker then still serves its
        streams for up to its final flush, so what they run still holds
        its credits (a forwarding replica's decider, which decides on, counts
        them when the replica's stream ends)."""
        slot.serving.clear()
        slot.trips_before.update(slot.trips)
        slot.trips, slot.open_connections = {}, 0
        slot.dropped_before.update({name: use[2] for name, use in slot.caches.items()})
        slot.caches = {}
        if self._series is not None:
            self._series.forget(slot.index)
        if self.scrapes is not None and not self._stopping:
            self.scrapes.lost(slot.index)
            self._assign_scrapes()
        admission = self.admission
        held = list(slot.requests.items())
        for rid, _request in held:
            self._forget(slot, rid)
        if self._stopping:
            return
        if admission is not None:
            for _, request in held:
                admission.withdraw(request)
        if held:
            log.warning("epp worker %d gone: %d of its requests withdrawn", slot.index, len(held))

    def join(self, slot: WorkerSlot) -> None:
        """A link that is no worker of this process (a replica's stream to
        its decider, `epp.serve.decider`) joins: its messages go to
        `on_messages(slot, ...)` and it is answered as a worker is."""
        self.slots.append(slot)
        slot.serving.set()
        if self._geometry is not None and slot.link is not None:
            slot.link.send([wire.GEOMETRY, *self._geometry])

    def detach(self, slot: WorkerSlot) -> None:
        """A joined link ended: what it held ends here, as a dead worker's."""
        if slot in self.slots:
            self.slots.remove(slot)
        self._lost(slot)

    # -- processes -------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on the ext_proc port, start the workers; the port bound."""
        listener = socket.create_server((host, port), backlog=LISTEN_BACKLOG, reuse_port=False)
        listener.setblocking(False)
        self._listener = listener
        if self.admission is not None:
            self._publish_geometry(self.admission)
        for slot in self.slots:
            await self._spawn(slot)
        waits = [asyncio.ensure_future(slot.serving.wait()) for slot in self.slots]
        _, late = await asyncio.wait(waits, timeout=START_TIMEOUT_S)
        for wait in late:
            wait.cancel()
        if late:
            raise RuntimeError(
                f"{len(late)} of {len(self.slots)} epp workers not serving "
                f"after {START_TIMEOUT_S:.0f} s"
            )
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept)
        return listener.getsockname()[1]

    async def _spawn(self, slot: WorkerSlot) -> None:
        loop = asyncio.get_running_loop()
        control, child_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handoff, child_handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        handoff.setblocking(False)
        spec = self._spec(slot.index, child_control.fileno(), child_handoff.fileno())
        slot.requests, slot.recorded = {}, {}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "epp.serve.worker",
            stdin=asyncio.subprocess.PIPE,
            pass_fds=(child_control.fileno(), child_handoff.fileno()),
        )
        child_control.close()
        child_handoff.close()
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(spec))
        await process.stdin.drain()
        process.stdin.close()
        await self.attach(slot, control, handoff)
        slot.process = process
        watch = loop.create_task(self._watch(slot, process), name=f"epp worker {slot.index}")
        self._watches.add(watch)
        watch.add_done_callback(self._watches.discard)
        log.info("epp worker %d started (pid %d)", slot.index, process.pid)

    async def attach(
        self, slot: WorkerSlot, control: socket.socket, handoff: socket.socket | None = None
    ) -> wire.Link:
        """Serve a worker's link on `control` (and hand it connections on
        `handoff`); it first gets the health statuses and the endpoints."""
        link = wire.Link(
            lambda messages: self.on_messages(slot, messages), lambda: self._lost(slot)
        )
        await asyncio.get_running_loop().connect_accepted_socket(lambda: link, control)
        slot.link, slot.handoff = link, handoff
        for service, status in self._health.items():
            link.send([wire.READY, service, status])
        if self._endpoints:
            link.send([wire.ENDPOINTS, self._endpoints])
        if self._models is not None:
            link.send(self._models_message())
        if self._geometry is not None:
            link.send([wire.GEOMETRY, *self._geometry])
        return link

    async def _watch(self, slot: WorkerSlot, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if slot.link is not None:
            slot.link.close()
        if slot.handoff is not None:
            slot.handoff.close()
            slot.handoff = None
        if self._stopping:
            return
        slot.restarts += 1
        log.error(
            "epp worker %d (pid %d) exited with %s; starting it again",
            slot.index,
            process.pid,
            code,
        )
        await asyncio.sleep(RESTART_DELAY_S)
        if not self._stopping:
            await self._spawn(slot)

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.warning("ext_proc accept failed: %s", error)
                return
            with connection:
                self._hand_over(connection)

    def _hand_over(self, connection: socket.socket) -> None:
        slots = self.slots
        for _ in range(len(slots)):
            slot = slots[self._next % len(slots)]
            self._next += 1
            if not slot.live or slot.handoff is None:
                continue
            try:
                socket.send_fds(slot.handoff, [b"c"], [connection.fileno()])
            except OSError:
                continue
            slot.connections += 1
            return

    async def stop(self) -> None:
        """Stop accepting, end the links (the workers then close their
        connections and exit) and wait for the processes."""
        self._stopping = True
        listener = self._listener
        if listener is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(listener.fileno())
            listener.close()
        for slot in self.slots:
            if slot.link is not None:
                slot.link.close()
        for slot in self.slots:
            process = slot.process
            if process is None or process.returncode is not None:
                continue
            try:
                await asyncio.wait_for(process.wait(), STOP_WAIT_S)
            except TimeoutError:
                log.error("epp worker %d did not stop; killing it", slot.index)
                process.kill()
                await process.wait()
        for watch in list(self._watches):
            watch.cancel()
