"""A protocol worker of `epp serve --workers N`: the transport, the ext_proc
stream machines and the parsing, in a process of its own, with the
decisions made by the core owner (`epp.serve.owner`) over a local socket
(`epp.serve.wire`). See docs/operations/workers.md.

`RemoteAdmission` is the worker's `Admission` (what `ExtProcService`
needs from flow control): it mirrors the in-process `AdmissionController`
call for call, as messages. Every request offered waits for the owner's
decision; the decision's fields (endpoint, destination, fallbacks,
routing, response headers) are written on the worker's copy of the
request, which the stream machine then reads as it would in one process.

The worker runs `python -m epp.serve.worker`, reads its `WorkerSpec`
(pickled) from stdin, and is handed its connections by the owner, which
accepts them on the ext_proc port. It ignores SIGINT and SIGTERM: the owner
drains and stops it. When the owner is gone, requests waiting for a
decision get 503 rejected-shutting-down, new ones too, and after
`FINAL_FLUSH_S` the connections close and the worker exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from random import Random

from epp.config.precise import TokenizerSettings
from epp.extproc.events import FirstToken, PrefillDone, Rejected, Release
from epp.extproc.parsers import Parser, parser_set
from epp.extproc.server import PROCESS_METHOD, AdmissionDenied, ExtProcService
from epp.extproc.stream import StreamSettings
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.kvblocks import PreciseConfig
from epp.scheduling.prefix import block_hashes
from epp.serve import wire
from epp.serve.command import loop_factory, settle_heap
from epp.serve.health import Health
from epp.serve.metrics.catalogue import P, spec
from epp.serve.metrics.recorder import PluginDurations, RequestMetrics
from epp.serve.metrics.series import Tally
from epp.serve.metrics.shipping import take
from epp.serve.options import ServeOptions
from epp.serve.producers import worker_token_producer
from epp.serve.scrapes import ScrapeSettings, ScrapeShare
from epp.serve.tokenizer import TokenizerStats
from epp.transport import GrpcServer, TransportLimits

log = logging.getLogger("epp.serve.worker")

FINAL_FLUSH_S = 1.0
"""Once the owner is gone: how long open calls get before the connections close."""

OUTCOMES = {outcome.value: outcome for outcome in Outcome}
TRANSPORT_REPORT_S = 1.0
"""How often a worker ships its series and looks whether its transport series changed."""
ITL_BUCKETS = spec(P + "request_streaming_itl_seconds").buckets


class AdmissionFailed(Exception):
    """The owner's core raised on this request (the call answers 500)."""


@dataclass(slots=True, frozen=True)
class WorkerSpec:
    """What a worker process is told at start (pickled on its stdin)."""

    index: int
    control_fd: int
    """The worker's end of its framed link to the owner."""
    handoff_fd: int
    """The worker's end of the socket its connections arrive on (SCM_RIGHTS)."""
    options: ServeOptions
    parsers: tuple[Parser, ...]
    limits: TransportLimits
    seed: int
    self_signed: tuple[bytes, bytes] | None = None
    """The EPP's self-signed (certificate, key) PEM when TLS has no files."""
    scraping: ScrapeSettings | None = None
    """How to read the model servers' metrics (None: the pool has no metrics source)."""
    pool_name: str = ""
    """The pool's name on the outcome series this worker records."""
    models_responder: bool = False
    """Whether `GET /v1/models` is answered here, with the owner's last MODELS."""
    propagate_priority: bool = False
    """Whether forwarded bodies carry the priority each DECISION gives."""
    tokenizer: TokenizerSettings | None = None
    """The token producer's settings (None: prompts are not tokenized here)."""
    tokenizer_key: tuple[str, str, str] | None = None
    """Its labels on the plugin duration series, which this worker ships."""
    precise: PreciseConfig | None = None
    """The precise prefix producer, whose block keys of a tokenized prompt cross."""


class RemoteAdmission:
    """`Admission` over the link to the owner (see the module docstring).
    A request is known by its `rid` from `offer` until its last message
    (COMPLETE, CANCEL, or REJECTED of an undispatched request)."""

    def __init__(
        self,
        link: wire.Link | None = None,
        seed: int = 0,
        metrics: RequestMetrics | None = None,
        durations: PluginDurations | None = None,
    ) -> None:
        self.link = link
        self.metrics = metrics
        """Where this worker records its requests' stream-side series (`ship`
        sends them to the owner); None: the owner records none of them."""
        self.durations = durations
        """The plugin calls timed here (the token producer's), shipped with `metrics`."""
        self.tokenizer: TokenizerStats | None = None
        """The token producer's counts here, their growth shipped with `metrics`."""
        self._tokenized: tuple[int, Counter[str], dict[str, list[int]]] = (0, Counter(), {})
        """The counts of `tokenizer` when last shipped."""
        self.on_evict: Callable[[FlowRequest], None] | None = None
        self.health: Health | None = None
        self.owner_gone = asyncio.Event()
        self.on_scrape: Callable[[list[list[object]]], None] | None = None
        """Gets each SCRAPE message's share (`epp.serve.scrapes.ScrapeShare.assign`)."""
        self.on_settled: Callable[[FlowRequest, Exception | None], None] | None = None
        """When set, told of each request as it is decided (None), denied or
        failed (the exception `wait` would raise), for a caller that does not
        `wait` (a forwarding replica's core owner: `epp.serve.replica.Relay`)."""
        self._rids = count()
        self._requests: dict[int, FlowRequest] = {}
        self._rid_of: dict[FlowRequest, int] = {}
        self._waiters: dict[FlowRequest, asyncio.Future[Outcome | Exception]] = {}
        self._early: dict[FlowRequest, Exception] = {}
        """A failure or denial that came before `wait` was called."""
        self._gaps: dict[FlowRequest, Tally] = {}
        """Each streaming request's gaps between chunks, until its COMPLETE."""
        self._body_priority: dict[FlowRequest, int] = {}
        """The forwarded body's priority of each dispatched request, until forwarded."""
        self._endpoints: list[str] = []
        self._models: bytes | None = None
        """The models-responder's answer as the owner last sent it."""
        self._geometry: tuple[int, int] | None = None
        """The owner's prefix scorer's (block characters, blocks per prompt)."""
        self._rng = Random(seed)
        self._gone = False

    @property
    def pending(self) -> int:
        """Requests the owner knows of through this worker."""
        return len(self._requests)

    # -- Admission ---------------------------------------------------------------

    def offer(self, request: FlowRequest) -> Outcome | None:
        if self._gone or self.link is None:
            return self._shut_out(request)
        geometry = self._geometry
        payload = request.payload
        if geometry is not None and payload.prefix_hashes is None:
            block_chars, max_blocks = geometry
            hashes = block_hashes(payload.prompt, payload.target_model, block_chars, max_blocks)
            payload.prefix_hashes = (block_chars, max_blocks, hashes)
        rid = next(self._rids)
        self._requests[rid] = request
        self._rid_of[request] = rid
        self.link.send([wire.ARRIVE, rid, *wire.arrival_fields(request)])
        return None

    async def wait(self, request: FlowRequest) -> Outcome:
        error = self._early.pop(request, None)
        if error is not None:
            raise error
        if request.outcome is not None:
            return request.outcome
        future: asyncio.Future[Outcome | Exception] = asyncio.get_running_loop().create_future()
        self._waiters[request] = future
        try:
            outcome = await future
        except asyncio.CancelledError:
            self.withdraw(request)
            raise
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def withdraw(self, request: FlowRequest) -> None:
        self._waiters.pop(request, None)
        if request.state is State.DISPATCHED:
            self.complete(request)
            return
        rid = self._forget(request)
        if rid is not None:
            # After its DECISION (not dispatched) it is no cancel: the decision stands.
            self._send([wire.CANCEL if request.outcome is None else wire.REJECTED, rid])

    def complete(
        self, request: FlowRequest, usage: Usage | None = None, itl: float | None = None
    ) -> None:
        self._complete(request, [*wire.usage_fields(usage), itl])

    def first_token(self, request: FlowRequest) -> None:
        rid = self._rid_of.get(request)
        if rid is not None:
            self._send([wire.FIRST_TOKEN, rid])

    def prefill_done(self, request: FlowRequest) -> None:
        rid = self._rid_of.get(request)
        if rid is not None:
            self._send([wire.PREFILL_DONE, rid])

    # -- what the worker's service reports ------------------------------------------

    def rejected(self, event: Rejected) -> None:
        """A local error reply: an undispatched request the owner knows ends there."""
        if event.request is not None:
            self.done_undispatched(event.request)

    def done_undispatched(self, request: FlowRequest) -> None:
        """Nothing more will come of `request` unless it was dispatched: the
        owner forgets it (REJECTED)."""
        if request.state is State.DISPATCHED:
            return
        rid = self._forget(request)
        if rid is not None:
            self._send([wire.REJECTED, rid])

    def chunk_gaps(self, request: FlowRequest) -> Tally:
        """Where the stream tallies `request`'s gaps between SSE chunks (added
        to the ITL series when it completes: a shipped series starts again
        from nothing, so a running stream keeps its own)."""
        tally = self._gaps[request] = Tally(ITL_BUCKETS)
        return tally

    def ship(self, pull: int | None = None) -> None:
        """Send the owner what the stream-side series gathered since the last
        time: in answer to PULL `pull` always, otherwise when there is something."""
        if self.metrics is None:
            return
        stats = self.tokenizer
        if stats is not None:
            caches = {
                name: [use.entries, use.capacity, use.dropped]
                for name, use in stats.caches().items()
            }
            if (stats.tokenized, stats.fallbacks, caches) != self._tokenized:
                tokenized, fallbacks, _ = self._tokenized
                self._send([
                    wire.TOKENIZED,
                    stats.tokenized - tokenized,
                    dict(stats.fallbacks - fallbacks),
                    caches,
                ])  # fmt: skip
                self._tokenized = (stats.tokenized, Counter(stats.fallbacks), caches)
        families = self.metrics.shipped_families()
        if self.durations is not None:
            families.append(self.durations.family)
        rows = take(families)
        if rows or pull is not None:
            self._send([wire.SERIES, pull, rows])

    def priority_in_body(self, request: FlowRequest) -> int | None:
        """The forwarded body's priority its DECISION gave `request` (read
        once; None: the owner does not propagate it, the body goes as sent)."""
        return self._body_priority.pop(request, None)

    def models(self) -> bytes | None:
        """The `GET /v1/models` answer (None: no endpoint reported its list yet)."""
        return self._models

    def any_endpoint(self) -> str | None:
        """A random endpoint of the pool as the owner last told it."""
        return self._rng.choice(self._endpoints) if self._endpoints else None

    # -- the owner's messages --------------------------------------------------------

    def on_messages(self, messages: list[wire.Message]) -> None:
        for message in messages:
            kind = message[0]
            if kind == wire.DECISION:
                self._decided(message[1], message[2:])
            elif kind == wire.DENIED:
                request = self._requests.get(message[1])
                if request is not None:
                    request.priority = message[3]
                self._settle(message[1], AdmissionDenied(message[2]))
            elif kind == wire.PULL:
                self.ship(message[1])
            elif kind == wire.EVICT:
                request = self._requests.get(message[1])
                if request is not None and self.on_evict is not None:
                    self.on_evict(request)
            elif kind == wire.ENDPOINTS:
                self._endpoints = message[1]
            elif kind == wire.SCRAPE and self.on_scrape is not None:
                self.on_scrape(message[1])
            elif kind == wire.MODELS:
                self._models = message[1].encode() if message[1] is not None else None
            elif kind == wire.GEOMETRY:
                self._geometry = (message[1], message[2]) if message[1] else None
            elif kind == wire.READY and self.health is not None:
                self.health.mirror(message[1], message[2])

    def on_lost(self) -> None:
        """The owner is gone: nothing waits for it any more."""
        self._gone = True
        for request, future in list(self._waiters.items()):
            if request.outcome is None:
                request.state = State.DROPPED
                request.outcome = Outcome.REJECTED_SHUTTING_DOWN
            if not future.done():
                future.set_result(Outcome.REJECTED_SHUTTING_DOWN)
        self._waiters.clear()
        self._requests.clear()
        self._rid_of.clear()
        self.owner_gone.set()

    # -- internals ---------------------------------------------------------------------

    def _decided(self, rid: int, fields: wire.Message) -> None:
        request = self._requests.get(rid)
        if request is None:
            return  # withdrawn meanwhile: the owner had its CANCEL
        (
            value,
            endpoint,
            destination,
            fallbacks,
            routing,
            response_headers,
            priority,
            body_priority,
            *record,
        ) = fields
        request.priority = priority
        if value is None:
            self._settle(rid, AdmissionFailed(f"request {request.request_id}"))
            return
        outcome = OUTCOMES[value]
        if outcome.is_dispatched:
            request.state = State.DISPATCHED
            request.endpoint = endpoint
            payload = request.payload
            payload.destination = destination
            payload.fallbacks = tuple(fallbacks)
            payload.routing = routing
            payload.response_headers = response_headers
            if body_priority is not None:
                self._body_priority[request] = body_priority
        else:
            request.state = State.DROPPED
        request.outcome = outcome
        future = self._waiters.pop(request, None)
        if future is not None and not future.done():
            future.set_result(outcome)
        if self.on_settled is not None:
            self.on_settled(request, None)
        metrics = self.metrics
        if metrics is not None:
            if record:
                # After the reply, as the in-process outcome hook runs.
                asyncio.get_running_loop().call_soon(metrics.record_outcome, request, record[0])
            elif outcome.is_dispatched:
                metrics.on_started(request)

    def _settle(self, rid: int, error: Exception) -> None:
        request = self._requests.get(rid)
        if request is None:
            return
        request.state = State.DROPPED
        if self.on_settled is not None:
            self.on_settled(request, error)
            return
        future = self._waiters.pop(request, None)
        if future is None:
            self._early[request] = error
        elif not future.done():
            future.set_result(error)

    def _shut_out(self, request: FlowRequest) -> Outcome:
        """`request` arrived with nobody to decide it, and never will be."""
        request.state = State.DROPPED
        request.outcome = Outcome.REJECTED_SHUTTING_DOWN
        if self.on_settled is not None:
            self.on_settled(request, None)
        return request.outcome

    def _complete(self, request: FlowRequest, fields: list[object]) -> None:
        if request.state is not State.DISPATCHED:
            return
        request.state = State.COMPLETED
        metrics = self.metrics
        if metrics is not None:
            gaps = self._gaps.get(request)
            if gaps is not None and gaps.count:
                metrics.chunk_gaps(request).merge(gaps)
            metrics.on_complete(request)
        rid = self._forget(request)
        if rid is not None:
            self._send([wire.COMPLETE, rid, *fields])

    def _forget(self, request: FlowRequest) -> int | None:
        self._gaps.pop(request, None)
        self._body_priority.pop(request, None)
        rid = self._rid_of.pop(request, None)
        if rid is not None:
            del self._requests[rid]
        return rid

    def _send(self, message: wire.Message) -> None:
        if self.link is not None:
            self.link.send(message)


class WorkerService(ExtProcService):
    """The ext_proc service of a worker: what the in-process service hands
    the admission controller and the metrics, it hands `RemoteAdmission`."""

    admission: RemoteAdmission

    def settle(self, event: Rejected | Release | PrefillDone | FirstToken) -> None:
        if isinstance(event, Rejected):
            self.admission.rejected(event)
        super().settle(event)


async def report_transport(server: GrpcServer, link: wire.Link, admission: RemoteAdmission) -> None:
    """Each second, ship the stream-side series, and tell the owner this
    process's open connections and limit trips when they changed."""
    last: tuple[int, dict[str, int]] = (0, {})
    while True:
        await asyncio.sleep(TRANSPORT_REPORT_S)
        admission.ship()
        now = (server.open_connections, dict(server.trips))
        if now != last:
            last = now
            link.send([wire.TRANSPORT, *now])


def no_priority(headers: object) -> int:
    """The worker leaves the priority to the owner, which holds the objectives."""
    return 0


async def run(spec: WorkerSpec) -> int:
    loop = asyncio.get_running_loop()
    options = spec.options
    metrics = RequestMetrics(spec.pool_name)
    metrics.flows_here = False
    durations = PluginDurations()
    admission = RemoteAdmission(seed=spec.seed, metrics=metrics, durations=durations)
    link = wire.Link(admission.on_messages, admission.on_lost)
    admission.link = link
    health = admission.health = Health()
    await health.start()  # before the link: the owner's statuses then replace these
    control = socket.socket(fileno=spec.control_fd)
    await loop.connect_accepted_socket(lambda: link, control)
    settings = StreamSettings(
        max_body_bytes=options.max_body_bytes,
        honour_subset=not options.disable_endpoint_subset_filter,
        default_model=options.default_model,
        parsers=parser_set(spec.parsers),
        any_endpoint=admission.any_endpoint,
        chunk_gaps=admission.chunk_gaps,
        models=admission.models if spec.models_responder else None,
        priority_in_body=admission.priority_in_body if spec.propagate_priority else None,
    )
    service = WorkerService(
        admission,
        no_priority,
        settings,
        listener=metrics.on_stream_event,
        on_response_processed=metrics.on_response_processed,
    )
    admission.on_evict = service.evict
    key, family = spec.tokenizer_key, durations.family

    def observe(seconds: float) -> None:
        # looked up each time: a shipped family starts again from no series
        family.tally(key).add(seconds)  # type: ignore[arg-type]

    producer = worker_token_producer(
        spec.tokenizer, spec.precise, options.token_cache_limits(), observe if key else None
    )
    if producer is not None:
        service.tokenize = producer.tokenize
        admission.tokenizer = producer.stats
    server = GrpcServer({PROCESS_METHOD: service.open, **health.routes()}, limits=spec.limits)
    ssl_context = None
    if options.secure_serving:
        from epp.serve.tls import server_ssl_context

        ssl_context = server_ssl_context(
            options.cert_files,
            options.tls_min_version,
            options.tls_cipher_suites,
            spec.self_signed,
        )
    handoff = socket.socket(fileno=spec.handoff_fd)
    handoff.setblocking(False)
    adopting: set[asyncio.Task[None]] = set()

    def receive_connections() -> None:
        try:
            _, fds, _, _ = socket.recv_fds(handoff, 64, 64)
        except BlockingIOError:
            return
        except OSError:
            fds = []
        if not fds:
            loop.remove_reader(handoff.fileno())  # the owner closed it
            return
        for fd in fds:
            task = loop.create_task(server.adopt(socket.socket(fileno=fd), ssl_context))
            adopting.add(task)
            task.add_done_callback(adopting.discard)

    loop.add_reader(handoff.fileno(), receive_connections)
    share = ScrapeShare(spec.scraping, link.send) if spec.scraping is not None else None
    if share is not None:
        admission.on_scrape = share.assign
        await share.scraper.start()
    settle_heap()
    link.send([wire.SERVING])
    reports = loop.create_task(report_transport(server, link, admission), name="transport report")
    log.info("epp worker %d serving (pid %d)", spec.index, os.getpid())
    await admission.owner_gone.wait()
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(handoff.fileno())
    reports.cancel()
    if share is not None:
        await share.scraper.stop()
    await server.stop(FINAL_FLUSH_S)
    if producer is not None:
        await producer.close()
    handoff.close()
    log.info("epp worker %d stopped", spec.index)
    return 0


def main() -> int:
    spec: WorkerSpec = pickle.loads(sys.stdin.buffer.read())
    from epp.serve import logs

    logs.configure(spec.options)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    with (
        asyncio.Runner(loop_factory=loop_factory()) as runner,
        contextlib.suppress(KeyboardInterrupt),
    ):
        return runner.run(run(spec))
    return 1


if __name__ == "__main__":
    sys.exit(main())
