"""Who decides where a simulated request goes.

`EppPolicy` is ours: the production `Core` (`build_core`: gate, `Scheduler`,
`FlowController`) wired as `epp serve` wires it, reading the simulation's
`EndpointStore`, and driven as the live adapter drives it: one core call per
event (an arrival, a completion with the real usage and the streamed
latency, a first token, the end of a remote prefill, a metrics publication
or membership change as `poke`, the wakeup the core asked for as `poke`),
whose settled requests are sent to their servers or ended. The core decides
when to dispatch; the policy only asks the simulation to wake it at
`next_wakeup()`. The objective's priority comes from the `ObjectiveRegistry`.

A request the scheduler disaggregates (a prefill endpoint in the
`x-prefiller-host-port` routing header) goes to its decode server by way of
its prefill server (`Simulation.send`).

Everything the configuration turns on runs as live: the admitters screen
each arrival first (a refusal ends it `admission-denied`, the live 500); a
request the core evicts is ended where it runs (`Simulation.evict`, outcome
`evicted`) and then completed like any other, once the settling under way
is done, so its credit returns once; the prefill deadline is the core's.

The baselines run on the same servers, each serving both stages.
`aggregated` is ours with the scenario's flow control and the default
scheduling profile (`without_disaggregation`). The others keep no queue:
`round-robin` is a Kubernetes Service (next live server in turn);
`least-queue` is the reference EPP with flow control off: every request goes
at once to the server with the fewest waiting requests in the last scraped
metrics (ties: fewest running, then at random).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from epp.api.models import InferenceObjective, InferencePool, PoolRef
from epp.api.registry import OBJECTIVE_HEADER, ObjectiveRegistry
from epp.config.loader import EppConfig
from epp.flowcontrol.config import Fairness
from epp.flowcontrol.request import FlowRequest, Usage
from epp.scheduling.core import build_core
from epp.scheduling.kvblocks import KVEvent
from epp.scheduling.prefix import block_hashes
from epp.scheduling.profiles import PREFILLER_HEADER
from epp.scheduling.request import UNMEASURED, InferenceRequest
from epp.sim.engine import Simulation
from epp.sim.requests import COMPLETED, NO_ENDPOINTS, SimRequest
from epp.sim.scenario import Scenario

ADMISSION_DENIED = "admission-denied"
"""A request an admitter refused (live: 500, no dropped reason)."""
CHARS_PER_TOKEN = 4
POOL_NAME = "sim-pool"
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
"""The headers of every simulated request (none), shared."""


@dataclass(slots=True)
class SimInference(InferenceRequest):
    """The scheduler's request, carrying the simulated request it stands for."""

    sim: SimRequest | None = None


def with_fairness(config: EppConfig, fairness: Fairness) -> EppConfig:
    """`config` with every band (and the band template) using `fairness`."""
    flow = config.flow_control
    flow = replace(
        flow,
        default_band=replace(flow.default_band, fairness=fairness),
        bands=tuple(replace(band, fairness=fairness) for band in flow.bands),
    )
    return replace(config, flow_control=flow)


def without_disaggregation(config: EppConfig) -> EppConfig:
    """`config` with the default scheduling (one profile, no P/D)."""
    return replace(config, scheduling=EppConfig().scheduling)


def prefix_text(group: str, tokens: int) -> str:
    """The shared prefix of `group`: `tokens` tokens of text of its own."""
    chars = tokens * CHARS_PER_TOKEN
    unit = f"<{group}|"
    return (unit * (chars // len(unit) + 1))[:chars]


class PromptBlocks:
    """The prefix-cache block hashes of a simulated prompt, given to the
    scheduler directly (`InferenceRequest.prefix_hashes`) instead of text it
    would have to hash: the simulator models prompts at block level.

    A prompt of `prompt_tokens` tokens has min(chars // block_chars,
    max_blocks) blocks, as its text would. Its leading blocks that lie wholly
    inside the tenant's shared prefix hash exactly as the prefix text would
    (`block_hashes` of that text, seeded with the target model), computed
    once per tenant; every later block is unique to the request, so it gets
    a value of its own, chained after them: -1 - (request_id * (max_blocks
    + 1) + position), which no xxh64 digest (never negative) and no other
    request's block can equal. (Small negative integers are cheaper to make
    and hash than 64-bit ones. The stride, odd for the usual power-of-two
    max_blocks, spreads the requests' low bits, hence their slots in the
    index's hash tables: with a power-of-two stride the blocks crowd into a
    few slots and every insertion probes.)
    """

    __slots__ = ("_prefixes", "block_chars", "max_blocks")

    def __init__(self, scenario: Scenario, block_chars: int, max_blocks: int) -> None:
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self._prefixes = [
            block_hashes(
                prefix_text(t.prefix_group, t.prefix_tokens),
                t.lora or scenario.model,
                block_chars,
                max_blocks,
            )
            if t.prefix_group
            else ()
            for t in scenario.tenants
        ]

    def of(self, request: SimRequest) -> tuple[tuple[int, int, Sequence[int]], int | None]:
        """The (block_chars, max_blocks, hashes) cache entry for `request`
        (a prompt with no shared prefix gets its blocks as a `range`, which
        costs nothing to build: `bench.simulator`), and the position from
        which its blocks are its own (None: it has none)."""
        max_blocks = self.max_blocks
        count = request.prompt_tokens * CHARS_PER_TOKEN // self.block_chars
        if count > max_blocks:  # not min(): it parses keywords per call (bench.instructions)
            count = max_blocks
        shared = self._prefixes[request.tenant]
        own_from = len(shared)
        if own_from >= count:
            return (self.block_chars, max_blocks, shared[:count]), None
        first = -1 - request.request_id * (max_blocks + 1) - own_from
        unique = range(first, first - (count - own_from), -1)
        return (
            (self.block_chars, max_blocks, shared + tuple(unique) if shared else unique),
            own_from,
        )


class EppPolicy:
    def __init__(self, sim: Simulation, config: EppConfig, seed: int) -> None:
        scenario = sim.scenario
        self.sim = sim
        self.core = build_core(
            config.flow_control,
            config.scheduling,
            sim.store.snapshot,
            sim.clock,
            random.Random(seed),
            eviction=config.flow_plugins.eviction,
            admitters=config.flow_plugins.admitters,
            admission_rng=random.Random(seed + 1),
        )
        self._evicted: list[FlowRequest] = []
        """What the core asked to evict, ended once the settling under way is done."""
        self._evicting = False
        self.core.on_evict = self._evicted.append
        self._screens = bool(self.core.admitters)
        pool = InferencePool(POOL_NAME)
        self.registry = ObjectiveRegistry(pool, self.core.ensure_bands)
        self.registry.replace(
            InferenceObjective(o.name, priority=o.priority, pool_refs=(PoolRef(POOL_NAME),))
            for o in scenario.objectives
        )
        self._priority = [
            self.registry.resolve({OBJECTIVE_HEADER: tenant.objective}).priority
            for tenant in scenario.tenants
        ]
        self._ttl = [tenant.ttl_s for tenant in scenario.tenants]
        self._fairness_id = [tenant.fairness_id for tenant in scenario.tenants]
        self._stream = [tenant.stream for tenant in scenario.tenants]
        self._model = scenario.model
        self._target = [tenant.lora or scenario.model for tenant in scenario.tenants]
        scheduling = config.scheduling
        self._blocks = PromptBlocks(
            scenario, scheduling.prefix_block_chars, scheduling.prefix_max_blocks
        )
        precise = scheduling.precise
        self._precise = (
            (precise.hasher.block_size, precise.max_blocks)
            if precise is not None and sim.content_keys
            else None
        )
        """The precise index's block size and blocks per prompt, when the
        servers' caches are keyed by content: the prompt's keys are then its
        blocks' (`Simulation.keys_of`), as a token producer and vLLM's
        hashing would give them."""

    def arrive(self, request: SimRequest, now: float) -> None:
        tenant = request.tenant
        prompt_tokens = request.prompt_tokens
        precise = self._precise
        if self.sim.content_keys:
            blocks, own_from = self._content_blocks(request), None
        else:
            blocks, own_from = self._blocks.of(request)
        payload = SimInference(
            self._model,
            self._target[tenant],
            "",
            self._stream[tenant],
            request.output_tokens,
            None,
            blocks,
            prompt_tokens,
            False,  # multimodal
            None,  # routing
            None,  # destination
            NO_HEADERS,
            None,  # attributes
            None,  # response headers
            (),  # fallbacks
            None,  # token ids
            None,  # cache salt
            b"",  # body
            False,  # chat
            self.sim.keys_of(request, *precise) if precise is not None else None,
            UNMEASURED,  # prefix match: no prefix metrics here (bench.instructions)
            own_from,
            request,
        )
        # All positional: calling a class with a keyword builds a dict.
        flow_request = FlowRequest(
            str(request.request_id),
            self._fairness_id[tenant],
            self._priority[tenant],
            now,
            prompt_tokens * CHARS_PER_TOKEN,
            prompt_tokens,
            self._ttl[tenant],
            None,  # ttft_slo
            payload,
        )
        if self._screens and self.core.screen(flow_request, now) is not None:
            self.sim.end(request, ADMISSION_DENIED, now)
            return
        request.owner = flow_request
        outcome, done = self.core.arrive(flow_request, now)
        if outcome is not None:
            self.sim.end(request, outcome.reason, now)
            return
        self._settle(done, now)

    def finished(self, request: SimRequest, now: float) -> None:
        itl = None
        if request.outcome == COMPLETED:
            served = request.output_tokens
            if served > 1 and self._stream[request.tenant]:
                itl = (now - request.first_token_at) / (served - 1)
        else:  # the server was lost: one token at most
            served = 0 if request.first_token_at is None else 1
        settled = self.core.complete(request.owner, now, Usage(request.prompt_tokens, served), itl)
        request.owner = None  # its FlowRequest is done with: let it go now
        self._settle(settled, now)

    def pool_changed(self, now: float) -> None:
        self._settle(self.core.poke(now), now)

    def prefill_done(self, request: SimRequest, now: float) -> None:
        """The decode server took `request` after its remote prefill (or
        instead of it): its response begins, which is how the EPP learns
        that the prefill stage is over."""
        settled = self.core.prefill_done(request.owner, now)
        if settled:
            self._settle(settled, now)

    def first_token(self, request: SimRequest, now: float) -> None:
        """A streamed response's first token reaches the EPP (a whole
        response arrives only at its end: `finished`)."""
        if self._stream[request.tenant] and request.owner is not None:
            settled = self.core.first_token(request.owner, now)
            if settled:
                self._settle(settled, now)

    def timer(self, now: float) -> None:
        self._settle(self.core.poke(now), now)

    def kv_events(self, address: str, events: list[KVEvent]) -> None:
        self.core.kv_events(address, events)

    def _content_blocks(self, request: SimRequest) -> tuple[int, int, Sequence[int]]:
        """The approximate index's blocks of `request` when prompts are keyed
        by content: its own block size and limit over the same content."""
        block_chars = self._blocks.block_chars
        max_blocks = self._blocks.max_blocks
        keys = self.sim.keys_of(request, block_chars // CHARS_PER_TOKEN, max_blocks)
        return (block_chars, max_blocks, keys)

    def queued_by_priority(self) -> dict[int, int]:
        return {band.priority: band.count for band in self.core.bands()}

    def limits(self) -> dict[str, int]:
        return self.core.limits()

    def _settle(self, settled: list[FlowRequest], now: float) -> None:
        """Send the requests the core dispatched, end those it ended, and ask
        to be woken when the core next wants to be."""
        sim = self.sim
        index_of = sim.index_of
        for flow_request in settled:
            payload = flow_request.payload
            request = payload.sim
            if flow_request.endpoint is None:
                sim.end(request, flow_request.outcome.reason, now)
                continue
            payload.prefix_hashes = payload.kv_block_keys = None
            routing = payload.routing
            prefiller = routing.get(PREFILLER_HEADER) if routing is not None else None
            sim.send(
                request,
                index_of[flow_request.endpoint],
                now,
                -1 if prefiller is None else index_of[prefiller],
            )
        wakeup = self.core.next_wakeup()
        if wakeup is not None and wakeup < sim.timer_at:  # spares the call (bench.instructions)
            sim.want_timer(wakeup)
        if self._evicted and not self._evicting:
            self._evict(now)

    def _evict(self, now: float) -> None:
        """End the requests the core evicted, each completing as it ends
        (which may evict the next: handled here, not deeper)."""
        self._evicting = True
        evicted = self._evicted
        while evicted:
            victim = evicted.pop(0)
            if victim.payload.sim.owner is victim:
                self.sim.evict(victim.payload.sim, now)
        self._evicting = False


class RoundRobinPolicy:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._turn = 0

    def arrive(self, request: SimRequest, now: float) -> None:
        live = self.sim.live_servers()
        if not live:
            self.sim.end(request, NO_ENDPOINTS, now)
            return
        self._turn += 1
        self.sim.send(request, live[self._turn % len(live)], now)

    def finished(self, request: SimRequest, now: float) -> None:
        pass

    def pool_changed(self, now: float) -> None:
        pass

    def prefill_done(self, request: SimRequest, now: float) -> None:
        pass

    def first_token(self, request: SimRequest, now: float) -> None:
        pass

    def timer(self, now: float) -> None:
        pass

    def kv_events(self, address: str, events: list[KVEvent]) -> None:
        pass

    def queued_by_priority(self) -> dict[int, int]:
        return {}

    def limits(self) -> dict[str, int]:
        return {}


class LeastQueuePolicy(RoundRobinPolicy):
    def __init__(self, sim: Simulation, seed: int) -> None:
        super().__init__(sim)
        self._rng = random.Random(seed)

    def arrive(self, request: SimRequest, now: float) -> None:
        endpoints = self.sim.store.snapshot().endpoints
        if not endpoints:
            self.sim.end(request, NO_ENDPOINTS, now)
            return
        best = min((e.metrics.waiting, e.metrics.running) for e in endpoints)
        ties = [e for e in endpoints if (e.metrics.waiting, e.metrics.running) == best]
        chosen = ties[self._rng.randrange(len(ties))] if len(ties) > 1 else ties[0]
        self.sim.send(request, self.sim.index_of[chosen.address], now)


def priorities(scenario: Scenario) -> Iterable[int]:
    return sorted({o.priority for o in scenario.objectives} | {0}, reverse=True)
