"""A vLLM-like model server as a pure object on the caller's clock.

What it models:
- continuous batching: at every step boundary the scheduler moves waiting
  requests into the running batch (FCFS, up to `max_num_seqs`, while KV-cache
  blocks last); a request whose LoRA adapter cannot be loaded (all
  `max_loras` slots busy) is skipped, as vLLM does;
- a step decodes one token for every running request and lasts
  decode_ms_per_token x (1 + decode_batch_growth x (batch - 1)); a step that
  admits requests also prefills them: + prefill_overhead_ms +
  prefill_ms_per_token x uncached prompt tokens each (+ lora_load_ms per
  adapter loaded). A request's first token comes at the end of its prefill
  step, each further token one step later;
- KV cache: a request holds ceil((prompt + output) / block_size) blocks minus
  the prompt blocks it finds cached; prefix caching keeps the blocks of
  shared prompt prefixes (`prefix_group`, or the prompt's own block hashes
  `block_keys` when the caller has its text) in an LRU bounded by the free
  blocks, and a prompt reuses its leading cached blocks; with `kv_log` set
  to a list, every change to that cache is appended to it as the vLLM KV
  event that tells it (`epp.scheduling.kvblocks`: BlockStored with the
  block before the first and their tokens when known, BlockRemoved,
  AllBlocksCleared) for the caller to publish;
- a waiting queue bounded by `max_waiting` (0 = unbounded): a request that
  arrives to a full queue is rejected;
- the inter-token latency histogram's sum, count and buckets (vLLM's
  bounds), as vLLM's `inter_token_latency_seconds` would show them: every
  step gives each request it decodes (not the ones it prefills) one
  observation of the step's length. Kept per run of identical steps, not
  per token;
- prefill/decode disaggregation: a request with `remote_kv` brings its
  prompt's KV from a prefill server (the sidecar's decode leg), so its step
  computes no prefill: it takes its blocks and decodes from its first step.
  A prefill server is this same model fed only remote-prefill legs (output
  1 token): every step is then a batch of prefills, compute-bound at
  1000 / prefill_ms_per_token tokens per second.

Event-efficient: the batch only changes at an admission or a completion, so
the server advances over whole runs of identical steps at once, keyed by a
decode-step counter (a request finishes when the counter reaches its
`finish_step`). Costs are O(log batch) per request, not per token.

The caller (the simulator, or a live demo driving it in real time) calls
`admit(request, now)`, asks `next_event_time()`, and calls `advance(now)`,
which reports starts, first tokens and completions to the `ServerListener`.
No I/O, no clock of its own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from itertools import accumulate
from math import inf
from typing import Any, Protocol

from epp.scheduling.endpoint import EndpointMetrics
from epp.scheduling.kvblocks import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

NO_ADAPTERS: frozenset[str] = frozenset()

ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""The inter-token latency histogram's upper bounds (s), vLLM's (0.11)."""


@dataclass(slots=True, frozen=True)
class ServerParams:
    """One model server's shape and speed (times in milliseconds)."""

    max_num_seqs: int = 32
    prefill_ms_per_token: float = 0.2
    prefill_overhead_ms: float = 5.0
    decode_ms_per_token: float = 12.0
    decode_batch_growth: float = 0.02
    kv_blocks: int = 8000
    block_size: int = 16
    max_waiting: int = 0
    max_loras: int = 0
    lora_load_ms: float = 20.0


@dataclass(slots=True, eq=False)
class ServerRequest:
    """A request as the server sees it. The caller fills the first block;
    the server writes the timings (None until they happen)."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    prefix_group: int = -1
    prefix_tokens: int = 0
    lora: str | None = None
    owner: Any = None
    remote_kv: bool = False
    block_keys: Sequence[int] = ()
    """The prompt's cacheable blocks by content (chained hashes); when given,
    they key the prefix cache instead of `prefix_group`."""
    token_ids: Sequence[int] = ()
    """The prompt's tokens, when the caller has them (told with the blocks
    stored, as vLLM's events tell them)."""

    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int = 0
    blocks: int = 0
    finish_step: int = 0


class ServerListener(Protocol):
    def started(self, request: ServerRequest, now: float) -> None:
        """`request` left the waiting queue and entered the batch."""
        ...

    def first_token(self, request: ServerRequest, now: float) -> None: ...

    def finished(self, request: ServerRequest, now: float) -> None: ...


class ModelServer:
    """See the module docstring. `running` counts the batch (prefilling
    requests included); `waiting` the queue; `max_waiting_seen` the longest
    the queue has been, counting a rejected arrival as one more."""

    __slots__ = (
        "_cache",
        "_decode_bucket",
        "_decode_time",
        "_itl_used",
        "_lora_active",
        "_params",
        "_prefilling",
        "_running",
        "_seg_end",
        "_seg_start",
        "_seg_steps",
        "_seq",
        "_step",
        "_step_bucket",
        "_step_ms",
        "_step_time",
        "cached_tokens",
        "itl_buckets",
        "itl_count",
        "itl_sum",
        "kv_log",
        "listener",
        "max_waiting_seen",
        "prompt_tokens",
        "rejected",
        "used_blocks",
        "waiting",
    )

    def __init__(self, params: ServerParams, listener: ServerListener) -> None:
        if params.max_num_seqs <= 0 or params.kv_blocks <= 0 or params.block_size <= 0:
            raise ValueError("max_num_seqs, kv_blocks and block_size must be positive")
        self.listener = listener
        self.waiting: deque[ServerRequest] = deque()
        self._running: list[tuple[int, int, ServerRequest]] = []
        self._prefilling: list[ServerRequest] = []
        self._itl_used = 1
        """The histogram's buckets (of its bounds') past the first
        `_itl_used` hold no count, so each one's cumulative count is the one
        before it (a bound, kept by `_use_buckets` whenever a step's bucket
        is set)."""
        self.params = params
        self._cache: OrderedDict[tuple[int, int] | int, None] = OrderedDict()
        self._lora_active: dict[str, int] = {}
        self._step = 0
        self._seq = 0
        self._seg_start = 0.0
        self._seg_steps = 0
        self._step_time = 0.0
        self._step_bucket = 0
        """The latency histogram's bucket of a step of `_step_time`."""
        self._seg_end = inf
        self.used_blocks = 0
        self.max_waiting_seen = 0
        self.rejected = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.itl_sum = 0.0
        self.itl_count = 0
        self.itl_buckets = [0] * (len(ITL_BUCKETS) + 1)
        """The latency histogram up to the start of the current run of steps
        (its buckets' own counts, the last one past the largest bound)."""
        self.kv_log: list[KVEvent] | None = None

    # -- the caller's side ------------------------------------------------

    @property
    def params(self) -> ServerParams:
        """Its shape and speed. Set anew, they apply from its next step that
        changes the batch; it keeps what it holds."""
        return self._params

    @params.setter
    def params(self, params: ServerParams) -> None:
        self._params = params
        # A decode step's length (ms, and s with its histogram bucket) by
        # batch size, worked out once rather than per step
        # (bench.instructions); up to the batch it holds, when the new
        # shape allows less.
        largest = len(self._running) + len(self._prefilling)
        if largest < params.max_num_seqs:
            largest = params.max_num_seqs
        self._step_ms = [
            params.decode_ms_per_token * (1.0 + params.decode_batch_growth * (batch - 1))
            for batch in range(largest + 1)
        ]
        self._decode_time = [step_ms / 1000.0 for step_ms in self._step_ms]
        self._decode_bucket = [bisect_left(ITL_BUCKETS, time) for time in self._decode_time]
        self._use_buckets(max(self._decode_bucket))

    def _use_buckets(self, bucket: int) -> None:
        """Steps may count in histogram bucket `bucket` from now on."""
        if bucket >= self._itl_used:
            self._itl_used = bucket + 1 if bucket < len(ITL_BUCKETS) else len(ITL_BUCKETS)

    @property
    def running(self) -> int:
        return len(self._running) + len(self._prefilling)

    def could_admit(self, tokens: float) -> bool:
        """Whether nothing waits and a request of `tokens` (prompt and
        output) would join the batch at the next step: a slot and its KV
        blocks are free."""
        params = self._params
        return (
            not self.waiting
            and len(self._running) + len(self._prefilling) < params.max_num_seqs
            and self.used_blocks + tokens / params.block_size <= params.kv_blocks
        )

    def next_event_time(self) -> float:
        """When the batch next changes (a step with news ends); inf when idle."""
        return self._seg_end

    def admit(self, request: ServerRequest, now: float) -> bool:
        """A request arrives at `now`. False when the waiting queue is full."""
        if self._seg_end <= now:
            self.advance(now)
        waiting = self.waiting
        limit = self._params.max_waiting
        queued = len(waiting) + 1
        if queued > self.max_waiting_seen:
            self.max_waiting_seen = queued
        if limit and queued > limit:
            self.rejected += 1
            return False
        waiting.append(request)
        if self._seg_end == inf:
            self._start(now)
        elif (
            self._seg_steps > 1
            and not self._prefilling
            and len(self._running) < self._params.max_num_seqs
        ):
            # Cut the run of decode steps at the end of the current step, so
            # the newcomer is scheduled at the next step boundary.
            step_time = self._step_time
            done = int((now - self._seg_start) / step_time)
            tokens = done * len(self._running)
            self.itl_count += tokens
            self.itl_sum += tokens * step_time
            self.itl_buckets[self._step_bucket] += tokens
            self._seg_start += done * step_time
            self._step += done
            self._seg_steps = 1
            self._seg_end = self._seg_start + step_time
        return True

    def advance(self, now: float) -> float:
        """Play every step that ends at or before `now`; returns
        `next_event_time()`. (Each segment's end is played here rather than
        in a method of its own: this runs for every server event.)"""
        listener = self.listener
        running = self._running
        while self._seg_end <= now:
            end = self._seg_end
            step = self._step = self._step + self._seg_steps
            if running:
                tokens = self._seg_steps * len(running)  # the tokens of the run
                self.itl_count += tokens
                self.itl_sum += tokens * self._step_time
                self.itl_buckets[self._step_bucket] += tokens
            if self._prefilling:
                for request in self._prefilling:
                    request.first_token_at = end
                    listener.first_token(request, end)
                    self._seq += 1
                    request.finish_step = step + request.output_tokens - 1
                    heappush(running, (request.finish_step, self._seq, request))
                self._prefilling = []
            while running and running[0][0] <= step:
                request = heappop(running)[2]
                self._release(request)
                request.finished_at = end
                listener.finished(request, end)
            if self.waiting:
                self._start(end)
            else:  # what `_start` does with nothing waiting, one call fewer
                self._decode(end)
        return self._seg_end

    def fail(self) -> list[ServerRequest]:
        """The server dies: every request it holds is returned, it is emptied
        (its prefix cache included) and it stays idle until admitted to again."""
        lost = [entry[2] for entry in self._running]
        lost.extend(self._prefilling)
        lost.extend(self.waiting)
        self.waiting.clear()
        self._running.clear()
        self._prefilling = []
        self._cache.clear()
        if self.kv_log is not None:
            self.kv_log.append(AllBlocksCleared())
        self._lora_active.clear()
        self.used_blocks = 0
        self._seg_end = inf
        self._seg_steps = 0
        self.itl_sum = 0.0  # a restarted server's histograms start again
        self.itl_count = 0
        self.itl_buckets = [0] * (len(ITL_BUCKETS) + 1)
        return lost

    def abort(self, request: ServerRequest, now: float) -> bool:
        """The client of `request` went away: it leaves the queue or the
        batch and frees its blocks and adapter, with no completion reported.
        False when the server no longer holds it. O(queue + batch)."""
        if self._seg_end <= now:
            self.advance(now)
        waiting = self.waiting
        queued = next((i for i, held in enumerate(waiting) if held is request), -1)
        if queued >= 0:
            del waiting[queued]
            return True
        prefilling = next((i for i, held in enumerate(self._prefilling) if held is request), -1)
        if prefilling >= 0:
            del self._prefilling[prefilling]
        else:
            entries = self._running
            index = next((i for i, entry in enumerate(entries) if entry[2] is request), -1)
            if index < 0:
                return False
            entries[index] = entries[-1]
            entries.pop()
            heapify(entries)
        self._release(request)
        return True

    def metrics(self, now: float) -> EndpointMetrics:
        """What the server's /metrics page would show at `now`."""
        params = self._params
        running = len(self._running)
        prefilling = len(self._prefilling)
        itl_sum = self.itl_sum
        itl_count = self.itl_count
        buckets = self.itl_buckets
        if running and not prefilling and now > self._seg_start:
            # The steps of the current run that ended by `now` (a step that
            # prefills gives its tokens at its end).
            steps = int((now - self._seg_start) / self._step_time)
            tokens = (steps if steps < self._seg_steps else self._seg_steps) * running
            if tokens:
                itl_count += tokens
                itl_sum += tokens * self._step_time
                buckets = buckets.copy()
                buckets[self._step_bucket] += tokens
        lora_running = lora_waiting = NO_ADAPTERS
        if params.max_loras:
            lora_running = frozenset(self._lora_active)
            lora_waiting = frozenset(r.lora for r in self.waiting if r.lora is not None)
        # The cumulative counts: summed over the buckets that may hold any, the
        # last repeated past them (a large-int addition spared per empty
        # bucket per scrape: bench.instructions).
        used = self._itl_used
        cumulative = tuple(accumulate(buckets[:used]))
        if used < len(ITL_BUCKETS):
            cumulative += (cumulative[-1],) * (len(ITL_BUCKETS) - used)
        kv_usage = self.used_blocks / params.kv_blocks
        if kv_usage > 1.0:  # not min(): it parses keywords per call (bench.instructions)
            kv_usage = 1.0
        return EndpointMetrics(
            len(self.waiting),
            running + prefilling,
            kv_usage,
            lora_running,
            lora_waiting,
            params.max_loras,
            params.block_size,
            params.kv_blocks,
            now,
            False,
            itl_sum,
            itl_count,
            ITL_BUCKETS,
            cumulative,
        )

    # -- the engine --------------------------------------------------------

    def _start(self, now: float) -> None:
        params = self._params
        waiting = self.waiting
        running = self._running
        if not waiting:
            self._decode(now)
            return
        room = params.max_num_seqs - len(running)
        prefill_ms = 0.0
        new: list[ServerRequest] = []
        index = 0
        loras = params.max_loras
        while room > 0 and index < len(waiting):
            request = waiting[index]
            lora_ms = self._lora_cost(request) if loras and request.lora is not None else 0.0
            if lora_ms is None:
                index += 1
                continue
            cost = self._reserve(request)
            if cost is None:
                break
            if index:
                del waiting[index]
            else:
                waiting.popleft()
            prefill_ms += cost + lora_ms
            new.append(request)
            room -= 1
        if not new:
            self._decode(now)
            return
        self._seg_start = now
        self._prefilling = new
        self._seg_steps = 1
        self._step_time = step_time = (self._step_ms[len(running) + len(new)] + prefill_ms) / 1000.0
        self._step_bucket = bucket = bisect_left(ITL_BUCKETS, step_time)
        if bucket >= self._itl_used:
            self._use_buckets(bucket)
        self._seg_end = now + step_time
        listener = self.listener
        for request in new:
            request.started_at = now
            listener.started(request, now)

    def _decode(self, now: float) -> None:
        """Decode the running batch until its next request finishes (idle
        when there is none)."""
        running = self._running
        if not running:
            self._seg_end = inf
            self._seg_steps = 0
            return
        batch = len(running)
        self._seg_start = now
        self._seg_steps = steps = running[0][0] - self._step
        self._step_time = step_time = self._decode_time[batch]
        self._step_bucket = self._decode_bucket[batch]
        self._seg_end = now + steps * step_time

    def _lora_cost(self, request: ServerRequest) -> float | None:
        """The adapter load time `request` adds (0 when none), or None when
        its adapter needs a slot and none is free."""
        lora = request.lora
        params = self._params
        if lora is None or not params.max_loras:
            return 0.0
        active = self._lora_active
        if lora in active:
            active[lora] += 1
            return 0.0
        if len(active) >= params.max_loras:
            return None
        active[lora] = 1
        return params.lora_load_ms

    def _reserve(self, request: ServerRequest) -> float | None:
        """Take `request`'s KV blocks; its prefill time in ms, or None when
        the blocks are not there (it then waits; its adapter is released)."""
        params = self._params
        size = params.block_size
        cached_blocks = 0
        shared_blocks = 0
        group = request.prefix_group
        keys = request.block_keys
        cache = self._cache
        if keys:
            shared_blocks = len(keys)
            while cached_blocks < shared_blocks and keys[cached_blocks] in cache:
                cached_blocks += 1
        elif group >= 0:
            shared = request.prefix_tokens  # not min(): it parses keywords (bench.instructions)
            if request.prompt_tokens < shared:
                shared = request.prompt_tokens
            shared_blocks = shared // size
            while cached_blocks < shared_blocks and (group, cached_blocks) in cache:
                cached_blocks += 1
        need = -(-(request.prompt_tokens + request.output_tokens) // size) - cached_blocks
        if self.used_blocks + need > params.kv_blocks:
            if request.lora is not None and params.max_loras:
                self._drop_lora(request.lora)
            return None
        self.used_blocks += need
        request.blocks = need
        cached = cached_blocks * size
        request.cached_tokens = cached
        if not request.remote_kv:  # a remote prompt counts where it was prefilled
            self.prompt_tokens += request.prompt_tokens
            self.cached_tokens += cached
        # Last block first, so a prompt's tail is the first evicted and its
        # head stays matchable (vLLM frees a request's blocks in reverse).
        for block in reversed(range(shared_blocks)):
            key = keys[block] if keys else (group, block)
            if block < cached_blocks:
                cache.move_to_end(key)
            else:
                cache[key] = None
        log = self.kv_log
        if log is not None and keys and shared_blocks > cached_blocks:
            tokens = request.token_ids
            log.append(
                BlockStored(
                    tuple(keys[cached_blocks:shared_blocks]),
                    keys[cached_blocks - 1] if cached_blocks else None,
                    tuple(tokens[cached_blocks * size : shared_blocks * size]),
                    size,
                )
            )
        request.block_keys = request.token_ids = ()  # cached or told: not needed again
        if cache:
            self._trim_cache()
        if request.remote_kv:
            return 0.0
        return params.prefill_overhead_ms + params.prefill_ms_per_token * (
            request.prompt_tokens - cached
        )

    def _release(self, request: ServerRequest) -> None:
        self.used_blocks -= request.blocks
        if request.lora is not None and self._params.max_loras:
            self._drop_lora(request.lora)

    def _drop_lora(self, lora: str) -> None:
        left = self._lora_active[lora] - 1
        if left:
            self._lora_active[lora] = left
        else:
            del self._lora_active[lora]

    def _trim_cache(self) -> None:
        cache = self._cache
        free = self._params.kv_blocks - self.used_blocks
        if len(cache) <= free:
            return
        evicted = []
        while len(cache) > free:
            evicted.append(cache.popitem(last=False)[0])
        if self.kv_log is not None:
            keys = tuple(key for key in evicted if isinstance(key, int))
            if keys:
                self.kv_log.append(BlockRemoved(keys))
