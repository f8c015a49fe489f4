"""The scenario file: what users write to describe a simulated pool and its load.

```yaml
name: overload-three-tiers
seed: 7
duration_s: 300
pool: {servers: 8, max_num_seqs: 32, prefill_ms_per_token: 0.2, decode_ms_per_token: 12,
       kv_blocks: 8000, block_size: 16, roles: {prefill: 3, decode: 5}}
kv_transfer: {fixed_ms: 2, bytes_per_token: 131072, gbytes_per_s: 25}
objectives: [{name: premium, priority: 10, slo_ttft_s: 2, slo_tpot_s: 0.025},
             {name: standard, priority: 0}]
tenants:
  - {name: a, objective: premium, rate_rps: 5, arrival: poisson,
     prompt_tokens: {lognormal: {mean: 600, sigma: 0.6}}, output_tokens: {constant: 200}}
events: [{at_s: 120, server_down: 3}]
epp: {config: config/epp/default.yaml}
baselines: [round-robin, least-queue]
```

`pool.roles` labels the servers with the reference's `llm-d.ai/role`, in
order (here servers 0-2 prefill, 3-7 decode; a server left out has no
label, so it serves both stages); `kv_transfer` prices moving a prompt's KV
cache from a prefill server to a decode server (see `KvTransfer`).

Reading a file into these is `epp.sim.scenario_file`'s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from epp.config.loader import EppConfig
from epp.flowcontrol.config import Fairness
from epp.sim.server_model import ServerParams

BASELINES = ("round-robin", "least-queue", "aggregated")
ROLES = (
    "decode",
    "prefill",
    "encode",
    "prefill-decode",
    "encode-prefill",
    "encode-prefill-decode",
    "both",
)
"""The values of the reference's `llm-d.ai/role` pod label."""
ARRIVALS = ("constant", "poisson")
DISTRIBUTIONS = ("constant", "uniform", "lognormal", "trace")


@dataclass(slots=True, frozen=True)
class Lengths:
    """A token-count distribution: `kind` is one of DISTRIBUTIONS; `a`, `b`
    are (value, -), (low, high) or (mean, sigma)."""

    kind: str
    a: float = 0.0
    b: float = 0.0


@dataclass(slots=True, frozen=True)
class Arrival:
    """`constant` or `poisson` at the tenant's rate, `bursts` (Poisson at the
    rate while on, nothing while off, starting on), `ramp` (Poisson, the rate
    moving linearly from `from_rps` to `to_rps` over the run), or `trace`
    (the timestamps of the trace file)."""

    kind: str
    on_s: float = 0.0
    off_s: float = 0.0
    from_rps: float = 0.0
    to_rps: float = 0.0


@dataclass(slots=True, frozen=True)
class Trace:
    """Rows of a trace file: arrival time (s), prompt and output tokens."""

    times: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class Conversation:
    """Multi-turn chat: each arrival starts a conversation of `turns` turns,
    one every `think_s` seconds; a turn's prompt is the conversation so far
    (the shared prefix, every earlier message and reply) and a new message
    of `prompt_tokens` tokens."""

    turns: int
    think_s: float


@dataclass(slots=True, frozen=True)
class Tenant:
    name: str
    objective: str
    fairness_id: str
    rate_rps: float
    arrival: Arrival
    prompt_tokens: Lengths
    output_tokens: Lengths
    prefix_group: str | None = None
    prefix_tokens: int = 0
    conversation: Conversation | None = None
    stream: bool = True
    lora: str | None = None
    ttl_s: float | None = None
    trace: Trace | None = None


@dataclass(slots=True, frozen=True)
class Objective:
    """`slo_ttft_s`, `slo_tpot_s`: the TTFT and the time per output token a
    completed request must meet to count as goodput (None: no limit)."""

    name: str
    priority: int
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None


@dataclass(slots=True, frozen=True)
class ServerEvent:
    """At `at_s`, server `server` (0-based, numbered across the pool's groups
    in order) goes down (`up` False), comes back (`up` True), or, with
    `params` set, keeps running with new parameters (a server that slows
    down, or restarts with another batch size, keeps what it holds). With
    `restart` it loses what it runs and its prefix cache and serves again at
    once, never leaving the pool (a container restart quicker than the
    readiness probe)."""

    at_s: float
    server: int
    up: bool
    params: ServerParams | None = None
    restart: bool = False


@dataclass(slots=True, frozen=True)
class Variant:
    """Another run of the EPP: with every band's fairness replaced, or with
    another configuration file."""

    name: str
    fairness: Fairness | None = None
    config: EppConfig | None = None
    config_path: str | None = None
    """The file `config` was read from (a live run gives it to `epp serve`)."""


@dataclass(slots=True, frozen=True)
class ServerGroup:
    """`servers` model servers with the same parameters."""

    servers: int
    params: ServerParams


P90_SIGMAS = 1.2815515655446004
"""The standard normal's 90th percentile: a lognormal's p90 is its median
times exp(this many sigmas)."""


@dataclass(slots=True, frozen=True)
class PathDelay:
    """One leg of the Envoy + EPP path, per request: lognormal, given by its
    median and p90 in milliseconds (p90 = median: always the median; median
    0: no delay)."""

    median_ms: float = 0.0
    p90_ms: float = 0.0
    _mu: float = field(init=False, repr=False, compare=False, default=0.0)
    _sigma: float = field(init=False, repr=False, compare=False, default=0.0)
    """The underlying normal's mean and deviation (0: always the median),
    worked out once: `draw` runs twice per simulated request."""

    def __post_init__(self) -> None:
        if self.median_ms < 0 or self.p90_ms < self.median_ms:
            raise ValueError(f"need 0 <= median <= p90, got {self.median_ms}, {self.p90_ms}")
        if 0 < self.median_ms < self.p90_ms:
            object.__setattr__(self, "_mu", math.log(self.median_ms))
            object.__setattr__(self, "_sigma", math.log(self.p90_ms / self.median_ms) / P90_SIGMAS)

    def __bool__(self) -> bool:
        return self.median_ms > 0

    def draw(self, rng: random.Random) -> float:
        """One request's delay, in seconds."""
        if not self._sigma:
            return self.median_ms / 1000.0
        # random.lognormvariate's own definition, one call fewer (twice per
        # simulated request: bench.instructions).
        return math.exp(rng.normalvariate(self._mu, self._sigma)) / 1000.0


REQUEST_PATH = PathDelay(5.0, 12.0)
"""The client's send to the request entering the server model, for a
request the EPP does not queue: Envoy, the ext_proc round trips of headers
and body with the EPP's work, Envoy again, the server's handler
(`bench.gateway_path`'s `to_model`; bench/README.md has the runs)."""
RESPONSE_PATH = PathDelay(2.0, 6.0)
"""The server model's first token or end to the client's read: the
server's handler and event loop, Envoy, the EPP's response processing,
Envoy again (`from_model`); the EPP sees a first token or an end this long
after the model too, within a fraction of a millisecond."""


@dataclass(slots=True, frozen=True)
class Pool:
    """The model servers, in groups (one group for a uniform pool); servers
    are numbered across the groups in order. `roles[i]`: server i's
    `llm-d.ai/role` label ("" = none); empty when no server has a role."""

    groups: tuple[ServerGroup, ...]
    scrape_interval_s: float = 0.05
    scrape_lag_s: float = 0.01
    roles: tuple[str, ...] = ()
    kv_event_lag_s: float | None = None
    """With a value, the servers publish their prefix caches' changes as
    vLLM's KV-cache events, reaching the EPP this long after (ZMQ and the
    subscriber), and key their caches by block content; None: no events."""
    request_path: PathDelay = REQUEST_PATH
    """From the EPP's dispatch to the server's receipt (`pool.path_ms.request`)."""
    response_path: PathDelay = RESPONSE_PATH
    """From the server's first token and its end to the client and the EPP
    (`pool.path_ms.response`), one draw per request for both."""
    token_producer: PathDelay = PathDelay()
    """The EPP's wait for a request's tokens before it offers it to the core,
    for a configuration whose token-producer tokenizes (the render round
    trip, or the local tokenizer; `pool.token_producer_ms`); none by default."""
    token_store: PathDelay = PathDelay()
    """The wait instead when the token producer's prefix store holds the
    prompt's first block (the local backend routes on the tokens it holds
    and encodes the rest, if any, after; `pool.token_store_ms`); none by
    default."""

    @property
    def servers(self) -> int:
        return sum(group.servers for group in self.groups)

    @property
    def server_params(self) -> tuple[ServerParams, ...]:
        """The parameters of each server, by its number."""
        return tuple(group.params for group in self.groups for _ in range(group.servers))

    @property
    def params(self) -> ServerParams:
        """The parameters of the first group (all of a uniform pool's)."""
        return self.groups[0].params


@dataclass(slots=True, frozen=True)
class KvTransfer:
    """Moving a prompt's KV cache from the prefill server to the decode
    server: `fixed_ms` (connection set-up, block handshake) plus the bytes
    (tokens x `bytes_per_token`: 2 (K and V) x layers x KV heads x head dim x
    bytes per value, 131,072 for Llama-3-8B in 16 bits) over the link
    (`gbytes_per_s`; 25 GB/s is a 200 Gb/s RDMA NIC)."""

    fixed_ms: float = 2.0
    bytes_per_token: float = 131072.0
    gbytes_per_s: float = 25.0

    def seconds(self, tokens: int) -> float:
        return self.fixed_ms / 1000.0 + tokens * self.bytes_per_token / (self.gbytes_per_s * 1e9)


@dataclass(slots=True, frozen=True)
class Scenario:
    name: str
    seed: int
    duration_s: float
    pool: Pool
    objectives: tuple[Objective, ...]
    tenants: tuple[Tenant, ...]
    events: tuple[ServerEvent, ...] = ()
    kv_transfer: KvTransfer = field(default_factory=KvTransfer)
    epp_config: EppConfig = field(default_factory=EppConfig)
    epp_config_path: str | None = None
    variants: tuple[Variant, ...] = ()
    baselines: tuple[str, ...] = BASELINES
    drain_s: float = 120.0
    isolation: bool = True
    model: str = "model"
    samples: int = 200

    def priority_of(self, objective: str) -> int:
        for candidate in self.objectives:
            if candidate.name == objective:
                return candidate.priority
        return 0
