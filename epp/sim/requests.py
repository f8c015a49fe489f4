"""What the engine and a policy share about a request: the simulated request
(the server's view plus who sent it, when, and how it ended), its remote
prefill leg under P/D, the outcomes a request ends with, and `Policy`, what
the engine tells the policy that routes the requests (the EPP or a baseline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from epp.scheduling.kvblocks import KVEvent
from epp.sim.server_model import ServerRequest

if TYPE_CHECKING:
    from epp.sim.scenario import Scenario
    from epp.sim.workload import Arrived

COMPLETED = "completed"
SERVER_REJECTED = "server-rejected"
SERVER_FAILED = "server-failed"
UNFINISHED = "unfinished"
NO_ENDPOINTS = "rejected-no-endpoints"
EVICTED = "evicted"


@dataclass(slots=True, eq=False)
class SimRequest(ServerRequest):
    """A request of the simulated workload: the server's view plus who sent
    it, when, and how its life ended (`outcome`, None while alive)."""

    tenant: int = 0
    arrival: float = 0.0
    server: int = -1
    outcome: str | None = None
    batched_at: float | None = None
    """When the request (or its remote prefill) first entered a batch."""
    prefill_server: int = -1
    """The prefill server it was sent to (-1: prefilled where it decodes)."""
    prefilled_at: float | None = None
    """When its remote prefill finished."""
    fallback: bool = False
    """Its remote prefill failed and it was prefilled on its decode server."""
    leg: PrefillLeg | None = None
    """Its remote prefill, once a prefill server took it."""
    conversation: int = -1
    """The conversation it is a turn of (-1: none)."""
    delivered_at: float | None = None
    """When it reached its (decode) server, after the request path."""
    response_delay: float | None = None
    """The response path's delay drawn for it (seconds), once its server
    wrote a first token or an end."""


@dataclass(slots=True, eq=False)
class PrefillLeg(ServerRequest):
    """The sidecar's remote prefill of `parent`: its prompt, one output token."""

    parent: SimRequest | None = None


def requests_of(scenario: Scenario, arrivals: list[Arrived]) -> list[SimRequest]:
    """The arrivals as simulated requests, numbered in arrival order, each
    with its tenant's prefix group (by number, -1 without one), prefix
    length and adapter."""
    tenants = scenario.tenants
    groups = sorted({t.prefix_group for t in tenants if t.prefix_group})
    group_of = [groups.index(t.prefix_group) if t.prefix_group else -1 for t in tenants]
    prefix_tokens_of = [t.prefix_tokens for t in tenants]
    lora_of = [t.lora for t in tenants]
    return [
        SimRequest(
            number,
            item.prompt_tokens,
            item.output_tokens,
            group_of[item.tenant],
            prefix_tokens_of[item.tenant],
            lora_of[item.tenant],
            tenant=item.tenant,
            arrival=item.time,
            conversation=item.conversation,
        )
        for number, item in enumerate(arrivals)
    ]


def tenant_prefixes(scenario: Scenario) -> list[int]:
    """Each tenant's prefix (its group for its model or adapter), by number;
    -1 for a tenant without a prefix group."""
    prefixes = sorted({(t.prefix_group, t.lora or "") for t in scenario.tenants if t.prefix_group})
    return [
        prefixes.index((t.prefix_group, t.lora or "")) if t.prefix_group else -1
        for t in scenario.tenants
    ]


class Policy(Protocol):
    """Where requests go: the EPP (flow control and scheduler) or a baseline."""

    def arrive(self, request: SimRequest, now: float) -> None: ...

    def finished(self, request: SimRequest, now: float) -> None:
        """`request` completed on its server, or was lost with it (`outcome` set)."""
        ...

    def pool_changed(self, now: float) -> None:
        """A metrics publication or a membership change."""
        ...

    def prefill_done(self, request: SimRequest, now: float) -> None:
        """`request`'s remote prefill is over: the decode server takes it
        (after the KV transfer, or for a local prefill after a failure)."""
        ...

    def first_token(self, request: SimRequest, now: float) -> None:
        """`request`'s first output token came (its response begins)."""
        ...

    def timer(self, now: float) -> None:
        """The time the policy asked for (`Simulation.want_timer`) came."""
        ...

    def kv_events(self, address: str, events: list[KVEvent]) -> None:
        """The server at `address` published `events` (one batch, in order)."""
        ...

    def queued_by_priority(self) -> dict[int, int]:
        """Requests waiting in the policy's own queues, per band."""
        ...

    def limits(self) -> dict[str, int]:
        """The in-flight limit per endpoint address the policy learned (none: {})."""
        ...
