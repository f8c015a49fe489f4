"""The event loop: one policy, one workload, one pool, on a virtual clock.

Events sit in a binary heap keyed by (time, sequence number), so equal
times resolve in the order they were scheduled and a run is a pure function
of the scenario and its seed. Arrivals come from the pre-drawn workload and
are merged with the heap rather than pushed into it.

Each model server has at most one live entry in the heap (its
`next_event_time`, kept in `_scheduled`); entries made stale by an admission
that moved that time are skipped when popped. Servers report starts at once and completions after
they have advanced, so a completion that dispatches more work never re-enters
a server in the middle of its step.

Disaggregated prefill/decode: `send(request, decode, now, prefill)` does
what the decode server's routing sidecar does with `x-prefiller-host-port`:
it sends the prompt to the prefill server as a `PrefillLeg` (max_tokens 1);
when the leg finishes, the KV cache moves to the decode server
(`Scenario.kv_transfer`, a TRANSFER event that long after), and the request
joins the decode server with `remote_kv`. If the prefill server rejects the
leg or fails with it, the sidecar falls back to a local prefill on the decode
server (`fallback`). A request whose decode server fails while its prefill
runs elsewhere ends `server-failed` when its KV would have arrived.
A simulation built `aggregated` labels no server with a role: the same
servers, each serving both stages.

Eviction: `evict(request, now)` ends a dispatched request where it is (its
remote prefill, its KV transfer, or its decode server's queue or batch),
frees what it held there, ends it `evicted` and tells the policy it is over,
as a live stream that the EPP ended would.

KV-cache events (`pool.kv_event_lag_ms`): each server's prefix cache is
keyed by block content (`epp.sim.blocks`) and logs its changes as vLLM's
events (`ModelServer.kv_log`); what a server call logged reaches the policy
as one batch `kv_event_lag_s` later (`Policy.kv_events`), in the server's
order, as its ZMQ publisher's batches would. A restart in place
(`server_restart`) is told as AllBlocksCleared, which is what the live
subscriber makes of a publisher whose sequence starts again. Conversations
key the servers' caches by content too, with or without events.

Endpoints: the live path's `EndpointStore` holds the pool, so the policy
reads the same snapshots a live EPP reads. Every `scrape_interval` each live
server's metrics are sampled (stamped then, as the live scraper stamps a
read when it asks for it) and written to the store `scrape_lag` later, so
the routing policy sees values as stale as a live scraper would; servers
going down or coming back leave or rejoin the store.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from heapq import heappop, heappush
from math import inf
from types import MappingProxyType

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.store import EndpointStore
from epp.sim.blocks import TokenStoreModel, block_keys
from epp.sim.requests import (
    COMPLETED,
    EVICTED,
    SERVER_FAILED,
    SERVER_REJECTED,
    UNFINISHED,
    Policy,
    PrefillLeg,
    SimRequest,
    requests_of,
    tenant_prefixes,
)
from epp.sim.samples import IdleCapacity, Samples
from epp.sim.scenario import Scenario, ServerEvent
from epp.sim.server_model import ModelServer, ServerRequest
from epp.sim.workload import Arrived

SERVER, SCRAPE, PUBLISH, TIMER, SAMPLE, POOL_EVENT, TRANSFER, KV_EVENTS = range(8)
DELIVER, FIRST_SEEN, DONE_SEEN, OFFER, END = range(8, 13)
NO_LABELS: Mapping[str, str] = MappingProxyType({})
ROLE_LABEL = "llm-d.ai/role"
PATH_SEED = 0x9A7E


def address_of(index: int) -> str:
    return f"10.0.{index // 256}.{index % 256}:8000"


class Simulation:
    """Runs one policy over one workload (see the module docstring).

    The policy calls back `send(request, server_index, now)` to hand a
    request to a server, and `end(request, outcome, now)` to end one
    without a server. `store.snapshot` and `clock()` are the pool and the clock
    the policy's components read.
    """

    def __init__(
        self,
        scenario: Scenario,
        arrivals: list[Arrived],
        weights: Callable[[int], tuple[float, float]],
        progress: Callable[[float], None] | None = None,
        aggregated: bool = False,
        measure_idle: bool = False,
        tokenizes: bool = False,
        token_store: bool = False,
    ) -> None:
        self.scenario = scenario
        pool = scenario.pool
        self.now = 0.0
        self.end_time = scenario.duration_s + scenario.drain_s
        self.servers = [ModelServer(params, self) for params in pool.server_params]
        self.addresses = [address_of(index) for index in range(pool.servers)]
        self.names = [f"server-{index}" for index in range(pool.servers)]
        roles = () if aggregated else pool.roles
        self.labels: list[Mapping[str, str]] = [
            MappingProxyType({ROLE_LABEL: role}) if role else NO_LABELS for role in roles
        ] or [NO_LABELS] * pool.servers
        self.index_of = {address: index for index, address in enumerate(self.addresses)}
        self.up = [True] * pool.servers
        self.content_keys = pool.kv_event_lag_s is not None or any(
            t.conversation is not None for t in scenario.tenants
        )
        """Whether the servers key their prefix caches by block content."""
        self.prefix_of = tenant_prefixes(scenario)
        """Each tenant's prefix (its group for its model or adapter), by number."""
        if pool.kv_event_lag_s is not None:
            for server in self.servers:
                server.kv_log = []
        self.requests = requests_of(scenario, arrivals)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._scheduled = [inf] * pool.servers
        self._finished: list[SimRequest] = []
        self._first_tokens: list[SimRequest] = []
        """First tokens of the server step being advanced, told to the
        policy after it (the policy may send to that server)."""
        self.timer_at = inf
        """When the policy's timer fires next (inf: not set)."""
        self._transfers = 0
        # None for a leg that is off: tested per event, where a PathDelay's
        # __bool__ would be a call each time (bench.instructions).
        self._request_path = pool.request_path or None
        self._response_path = pool.response_path or None
        self._path_rng = random.Random(scenario.seed ^ PATH_SEED)
        """The path's own draws, so a change to it leaves the workload's alone."""
        self._token_producer = (pool.token_producer or None) if tokenizes else None
        """The policy's wait for each request's tokens before it sees it."""
        self._token_store = (
            TokenStoreModel(lambda request, size: self.keys_of(request, size))
            if tokenizes and token_store
            else None
        )
        """The token producer's prefix store: a prompt whose first block it
        holds waits `pool.token_store`."""
        self.store = EndpointStore(self._live_specs())
        self.policy: Policy | None = None
        self._progress = progress
        tenants = len(scenario.tenants)
        self._weights = [weights(scenario.priority_of(t.objective)) for t in scenario.tenants]
        self._input_weight = [weight for weight, _ in self._weights]
        self._output_weight = [weight for _, weight in self._weights]
        self.waiting_by_tenant = [0] * tenants
        self.service_by_tenant = [0.0] * tenants
        self.samples = Samples()
        self.idle = IdleCapacity(pool.servers, self.requests) if measure_idle else None
        """None: not measured."""

    # -- what policies read -------------------------------------------------

    def clock(self) -> float:
        return self.now

    def live_servers(self) -> list[int]:
        return [index for index, up in enumerate(self.up) if up]

    # -- what policies do -----------------------------------------------------

    def send(
        self, request: SimRequest, server_index: int, now: float, prefill_index: int = -1
    ) -> None:
        """Hand `request` to a server (its prompt prefilled first on server
        `prefill_index`, when one is named), which receives it the request
        path's delay later; a full waiting queue rejects it."""
        request.server = server_index
        path = self._request_path
        if path is not None:
            leg = (request, server_index, prefill_index)
            self._seq += 1  # _push inline: once per request (bench.instructions)
            heappush(self._heap, (now + path.draw(self._path_rng), self._seq, DELIVER, leg))
        else:
            self._deliver(request, server_index, prefill_index, now)

    def _deliver(
        self, request: SimRequest, server_index: int, prefill_index: int, now: float
    ) -> None:
        if request.outcome is not None:  # evicted on its way
            return
        request.delivered_at = now
        if not self.up[server_index]:
            self.end(request, SERVER_FAILED, now)
            self.policy.finished(request, now)
            return
        if self.content_keys:
            request.block_keys = self.keys_of(request, self.scenario.pool.params.block_size)
        if prefill_index >= 0:
            request.prefill_server = prefill_index
            leg = PrefillLeg(
                request.request_id,
                request.prompt_tokens,
                1,
                request.prefix_group,
                request.prefix_tokens,
                request.lora,
                parent=request,
                block_keys=request.block_keys,
            )
            if self.up[prefill_index] and self._admit(leg, prefill_index, now):
                request.leg = leg
                return
            request.fallback = True
        if not self._admit(request, server_index, now):
            self.end(request, SERVER_REJECTED, now)
            self.policy.finished(request, now)

    def keys_of(
        self, request: SimRequest, block_size: int, max_blocks: int | None = None
    ) -> tuple[int, ...]:
        """The keys of `request`'s prompt blocks of `block_size` tokens (`blocks`)."""
        return block_keys(
            block_size,
            request.prompt_tokens,
            request.prefix_tokens,
            self.prefix_of[request.tenant],
            request.conversation,
            request.request_id,
            max_blocks,
        )

    def _admit(self, request: ServerRequest, server_index: int, now: float) -> bool:
        server = self.servers[server_index]
        admitted = server.admit(request, now)
        if server.kv_log:
            self._publish_kv(server_index, now)
        if not admitted:
            return False
        # `_reschedule` inline: once per request (bench.instructions).
        when = server.next_event_time()
        if when != self._scheduled[server_index]:
            self._scheduled[server_index] = when
            if when != inf:
                self._seq += 1
                heappush(self._heap, (when, self._seq, SERVER, server_index))
        return True

    def _publish_kv(self, server_index: int, now: float) -> None:
        """Send what the server's cache logged as one batch of KV events."""
        server = self.servers[server_index]
        events, server.kv_log = server.kv_log, []
        lag = self.scenario.pool.kv_event_lag_s
        self._push(now + (lag or 0.0), KV_EVENTS, (server_index, events))

    def _reschedule(self, server_index: int) -> None:
        """Keep the server's one heap entry at its next event time."""
        when = self.servers[server_index].next_event_time()
        if when != self._scheduled[server_index]:
            self._scheduled[server_index] = when
            if when != inf:
                self._seq += 1
                heappush(self._heap, (when, self._seq, SERVER, server_index))

    def _prefilled(self, leg: PrefillLeg, now: float) -> None:
        """A remote prefill finished: its KV cache moves to the decode server."""
        request = leg.parent
        request.prefilled_at = now
        self._transfers += 1
        self._push(now + self.scenario.kv_transfer.seconds(leg.prompt_tokens), TRANSFER, request)

    def _transferred(self, request: SimRequest, now: float) -> None:
        self._transfers -= 1
        if request.outcome is not None:  # evicted on its way
            return
        self.policy.prefill_done(request, now)
        if not self.up[request.server]:
            self.end(request, SERVER_FAILED, now)
            self.policy.finished(request, now)
            return
        request.remote_kv = True
        if not self._admit(request, request.server, now):
            self.end(request, SERVER_REJECTED, now)
            self.policy.finished(request, now)

    def _prefill_lost(self, leg: PrefillLeg, now: float) -> None:
        """The prefill server failed with the leg: prefill on the decode server."""
        request = leg.parent
        request.fallback = True
        self.policy.prefill_done(request, now)
        if not self.up[request.server]:
            self.end(request, SERVER_FAILED, now)
            self.policy.finished(request, now)
        elif not self._admit(request, request.server, now):
            self.end(request, SERVER_REJECTED, now)
            self.policy.finished(request, now)

    def end(self, request: SimRequest, outcome: str, now: float) -> None:
        """`request` ends without (further) service."""
        request.outcome = outcome
        if request.batched_at is None:
            self.waiting_by_tenant[request.tenant] -= 1
        request.finished_at = now

    def evict(self, request: SimRequest, now: float) -> None:
        """Flow control evicted the dispatched `request` (see the module
        docstring); nothing when it is over already."""
        if request.outcome is not None or request.finished_at is not None:
            return
        if request.leg is not None:
            self._abort(request.leg, request.prefill_server, now)
        self._abort(request, request.server, now)
        self.end(request, EVICTED, now)
        self.policy.finished(request, now)

    def _abort(self, request: ServerRequest, server_index: int, now: float) -> None:
        """Take `request` off its server if it still holds it."""
        if not self.up[server_index] or not self.servers[server_index].abort(request, now):
            return
        if self.servers[server_index].kv_log:
            self._publish_kv(server_index, now)
        self._reschedule(server_index)
        if self._finished or self._first_tokens:  # the abort advanced the server to `now`
            self._report(now)

    def _report(self, when: float) -> None:
        """Tell the policy what the servers' last steps reported: first
        tokens, then completions (a finished prefill leg moves its KV)."""
        if self._response_path is not None:
            self._report_later(when)
            return
        policy = self.policy
        first_tokens = self._first_tokens
        while first_tokens:
            policy.first_token(first_tokens.pop(0), when)
        finished = self._finished
        service = self.service_by_tenant
        weights = self._output_weight
        while finished:
            done = finished.pop()
            if type(done) is PrefillLeg:
                self._prefilled(done, when)
                continue
            done.outcome = COMPLETED
            service[done.tenant] += weights[done.tenant] * done.output_tokens
            policy.finished(done, when)

    def _report_later(self, when: float) -> None:
        """`_report` across the response path: a first token and an end
        reach the client and the policy one drawn delay after the server
        wrote them (a prefill leg's end stays with the sidecar). One draw
        per request, at the first of the two; the pushes are `_push` inline,
        as this runs twice per request (bench.instructions)."""
        path = self._response_path
        rng = self._path_rng
        heap = self._heap
        first_tokens = self._first_tokens
        for request in first_tokens:  # nothing is reported meanwhile
            delay = request.response_delay
            if delay is None:
                delay = request.response_delay = path.draw(rng)
            self._seq += 1
            heappush(heap, (when + delay, self._seq, FIRST_SEEN, request))
        first_tokens.clear()
        finished = self._finished
        while finished:
            done = finished.pop()
            if type(done) is PrefillLeg:
                self._prefilled(done, when)
                continue
            delay = done.response_delay
            if delay is None:
                delay = done.response_delay = path.draw(rng)
            self._seq += 1
            heappush(heap, (when + delay, self._seq, DONE_SEEN, done))

    def want_timer(self, when: float | None) -> None:
        """Make sure the policy's timer fires at `when` (None: no need)."""
        if when is not None and when < self.timer_at:
            self.timer_at = when
            self._push(when, TIMER, None)

    # -- the server listener ----------------------------------------------------

    def started(self, request: ServerRequest, now: float) -> None:
        owner: SimRequest = request.parent if type(request) is PrefillLeg else request  # type: ignore[assignment,attr-defined]
        if owner.batched_at is not None:
            return
        owner.batched_at = now
        tenant = owner.tenant
        self.waiting_by_tenant[tenant] -= 1
        self.service_by_tenant[tenant] += self._input_weight[tenant] * owner.prompt_tokens

    def first_token(self, request: ServerRequest, now: float) -> None:
        if type(request) is SimRequest:  # a prefill leg's token stays with the sidecar
            self._first_tokens.append(request)

    def finished(self, request: ServerRequest, now: float) -> None:
        self._finished.append(request)  # type: ignore[arg-type]

    # -- the loop -----------------------------------------------------------------

    def _push(self, when: float, kind: int, data: object) -> None:
        self._seq += 1
        heappush(self._heap, (when, self._seq, kind, data))

    def _live_specs(self) -> list[EndpointSpec]:
        """The servers that are up, in index order, as the store's sources give them."""
        return [
            EndpointSpec(name, address, labels)
            for name, address, labels, up in zip(
                self.names, self.addresses, self.labels, self.up, strict=True
            )
            if up
        ]

    def run(self, policy: Policy) -> None:
        self.policy = policy
        scenario = self.scenario
        pool = scenario.pool
        self._push(0.0, SCRAPE, None)
        for event in scenario.events:
            self._push(event.at_s, POOL_EVENT, event)
        sample_every = scenario.duration_s / scenario.samples
        self._push(0.0, SAMPLE, None)
        heap = self._heap
        requests = self.requests
        count = len(requests)
        next_index = 0
        servers = self.servers
        scheduled = self._scheduled
        finished = self._finished
        first_tokens = self._first_tokens
        end_time = self.end_time
        progress = self._progress
        progress_step = max(1, count // 100)
        waiting_by_tenant = self.waiting_by_tenant
        arrival_time = requests[0].arrival if count else inf
        report = self._report_later if self._response_path is not None else self._report
        service = self.service_by_tenant
        weights = self._output_weight
        # A last entry past every event (it ends the loop), so that the loop
        # need not test for an empty heap (bench.instructions).
        self._push(inf, END, None)
        while True:
            if heap[0][0] <= arrival_time:
                when, _, kind, data = heappop(heap)
                if when > end_time:
                    break
                self.now = when
                if kind == SERVER:
                    index = data
                    if scheduled[index] != when:
                        continue
                    server = servers[index]
                    following = server.advance(when)
                    if server.kv_log:
                        self._publish_kv(index, when)
                    scheduled[index] = following
                    if following != inf:
                        self._seq += 1
                        heappush(heap, (following, self._seq, SERVER, index))
                    if first_tokens or finished:
                        report(when)
                # The rest by how often they come (bench.instructions).
                elif kind == DELIVER:
                    self._deliver(*data, when)  # type: ignore[misc]
                elif kind == FIRST_SEEN:
                    if data.outcome is None:  # type: ignore[attr-defined]  # else ended meanwhile
                        data.first_token_at = when  # type: ignore[attr-defined]
                        policy.first_token(data, when)  # type: ignore[arg-type]
                elif kind == DONE_SEEN:
                    if data.outcome is None:  # type: ignore[attr-defined]  # else ended meanwhile
                        data.finished_at = when  # type: ignore[attr-defined]
                        data.outcome = COMPLETED  # type: ignore[attr-defined]
                        tenant = data.tenant  # type: ignore[attr-defined]
                        service[tenant] += weights[tenant] * data.output_tokens  # type: ignore[attr-defined]
                        policy.finished(data, when)  # type: ignore[arg-type]
                elif kind == SCRAPE:
                    if when <= scenario.duration_s or self._busy():
                        lag = pool.scrape_lag_s
                        sampled = [server.metrics(when) for server in servers]
                        self._push(when + lag, PUBLISH, sampled)
                        self._push(when + pool.scrape_interval_s, SCRAPE, None)
                        if self.idle is not None:
                            queued = any(policy.queued_by_priority().values())
                            self.idle.measure(servers, self.up, queued, pool.scrape_interval_s)
                elif kind == PUBLISH:
                    self.store.set_all_metrics(self.addresses, data)  # type: ignore[arg-type]
                    policy.pool_changed(when)
                elif kind == TIMER:
                    if when != self.timer_at:
                        continue
                    self.timer_at = inf
                    policy.timer(when)
                elif kind == SAMPLE:
                    self.samples.take(when, waiting_by_tenant, service, policy)
                    if when < scenario.duration_s:
                        self._push(min(when + sample_every, scenario.duration_s), SAMPLE, None)
                    elif self._busy():
                        self._push(when + sample_every, SAMPLE, None)
                elif kind == TRANSFER:
                    self._transferred(data, when)  # type: ignore[arg-type]
                elif kind == OFFER:
                    policy.arrive(data, when)  # type: ignore[arg-type]
                elif kind == KV_EVENTS:
                    index, events = data  # type: ignore[misc]
                    if self.up[index]:  # else its subscriber went with it
                        policy.kv_events(self.addresses[index], events)
                elif kind == END:  # only where end_time is inf: it is past every other
                    break
                else:
                    self._pool_event(data, when)  # type: ignore[arg-type]
            else:  # an arrival comes first (with none left, the last entry ends the loop)
                request = requests[next_index]
                next_index += 1
                self.now = now = arrival_time
                arrival_time = requests[next_index].arrival if next_index < count else inf
                waiting_by_tenant[request.tenant] += 1
                if self._token_store is not None:
                    held = self._token_store.covered(request) > 0
                    wait = pool.token_store if held else pool.token_producer
                    self._push(now + wait.draw(self._path_rng), OFFER, request)
                elif self._token_producer is not None:
                    self._push(now + self._token_producer.draw(self._path_rng), OFFER, request)
                else:
                    policy.arrive(request, now)
                if progress is not None and next_index % progress_step == 0:
                    progress(now)
        for request in requests:
            if request.outcome is None:
                request.outcome = UNFINISHED
        if progress is not None:
            progress(scenario.duration_s)

    def _busy(self) -> bool:
        if self._transfers:
            return True
        return any(server.next_event_time() != inf for server in self.servers) or any(
            self.policy.queued_by_priority().values()
        )

    def _pool_event(self, event: ServerEvent, now: float) -> None:
        index = event.server
        if event.params is not None:
            # The server keeps what it holds; the new speed and limits apply
            # from its next step that changes the batch.
            self.servers[index].params = event.params
            return
        if event.restart:
            if self.up[index]:
                self._fail(index, now)
            return
        if event.up == self.up[index]:
            return
        if event.up:
            self.up[index] = True
        else:
            self.up[index] = False
            self._fail(index, now)
        self.store.replace_all(self._live_specs())
        self.policy.pool_changed(now)

    def _fail(self, index: int, now: float) -> None:
        """Server `index` loses everything it holds: its requests end
        (remote prefills fall back), its cache is cleared."""
        server = self.servers[index]
        lost = server.fail()
        if server.kv_log:
            self._publish_kv(index, now)
        self._scheduled[index] = inf
        for request in lost:
            if type(request) is PrefillLeg:
                self._prefill_lost(request, now)
                continue
            self.end(request, SERVER_FAILED, now)
            self.policy.finished(request, now)
