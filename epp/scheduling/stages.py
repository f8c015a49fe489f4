"""Stage-aware credits for prefill/decode disaggregation.

The gate's per-endpoint credits bound the decode stage: a request takes one
at its endpoint (`request.endpoint`, the decode server's sidecar) when it is
dispatched and gives it back when it ends. `PrefillCredits` bounds the
prefill stage the same way, per prefill endpoint:

- a request the scheduler sends to a prefill endpoint (the
  `x-prefiller-host-port` of its routing) takes a credit there when it is
  dispatched (`on_dispatch`, as every gate);
- it gives it back when its prefill is over, which the shell learns when the
  decode server's response begins (the sidecar sends the decode leg only
  once the prefill has answered) or after a timeout, both kept by the core
  (`epp.scheduling.core`: `prefill_done`, the prefill deadline), which then
  dispatches again; at the latest when the request ends (`on_complete`).

The scheduler's prefill profile picks only prefill endpoints with a credit
left; a request the decider sends to prefill when none has one waits at the
head of its queue (the placer answers "no room"), and the core's dispatch
pass stops there: no lower band dispatches past a higher band waiting for a
prefill slot, and the same holds between the flows of a band.

Costs: O(1) per dispatch, release and completion.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.flowcontrol.gate import Addressed, AllGates, E, Gate, gate_parts
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.config import SchedulingConfig
from epp.scheduling.endpoint import Endpoint, PoolSnapshot
from epp.scheduling.filters import DECODE_ROLES, PREFILL_ROLES, ROLE_LABEL
from epp.scheduling.profiles import PREFILLER_HEADER, disagg_profile_handler
from epp.scheduling.request import InferenceRequest

DISAGG_HANDLERS = frozenset({"disagg-profile-handler", "pd-profile-handler"})

DECODE = "decode"
PREFILL = "prefill"


def endpoint_stages(endpoint: Endpoint) -> frozenset[str]:
    """The stages an endpoint serves, by the rule of `stage_pools`."""
    role = endpoint.labels.get(ROLE_LABEL)
    stages = set()
    if role is None or role in DECODE_ROLES:
        stages.add(DECODE)
    if role in PREFILL_ROLES:
        stages.add(PREFILL)
    return frozenset(stages)


def stage_pools(pool: PoolSnapshot) -> dict[str, PoolSnapshot]:
    """The pool's endpoints by the stage they serve, as the role filters
    choose them (decode: `llm-d.ai/role` a decode role, or none; prefill: a
    prefill role; a pod serving both is in both; encode-only pods in
    neither), as the reference partitions them for its per-stage
    saturation. A stage without endpoints is left out."""
    parts: dict[str, list] = {DECODE: [], PREFILL: []}
    for endpoint in pool.endpoints:
        for stage in endpoint_stages(endpoint):
            parts[stage].append(endpoint)
    return {
        stage: PoolSnapshot(tuple(endpoints), pool.version, pool.membership)
        for stage, endpoints in parts.items()
        if endpoints
    }


def disaggregates(config: SchedulingConfig) -> bool:
    """Whether `config`'s profile handler may send requests to a prefill
    endpoint (whatever the handler is named in the configuration)."""
    return config.handler.make is disagg_profile_handler


def prefiller_of(request: FlowRequest) -> str | None:
    """The prefill endpoint the scheduler chose for `request`, if any."""
    payload = request.payload
    if not isinstance(payload, InferenceRequest) or payload.routing is None:
        return None
    return payload.routing.get(PREFILLER_HEADER)


class PrefillCredits:
    """At most `max_per_endpoint` requests in their prefill stage per
    prefill endpoint (see the module docstring). A gate that never closes
    the pool: it only answers `has_room` for the scheduler."""

    __slots__ = ("_held", "_holders", "max_per_endpoint")

    def __init__(self, max_per_endpoint: int) -> None:
        if max_per_endpoint <= 0:
            raise ValueError(f"prefill credits per endpoint must be positive: {max_per_endpoint}")
        self.max_per_endpoint = max_per_endpoint
        self._held: dict[str, int] = {}
        self._holders: dict[FlowRequest, str] = {}
        """Who holds a credit, and where: each request at most one."""

    @property
    def in_flight(self) -> int:
        return len(self._holders)

    def in_flight_at(self, endpoint: str) -> int:
        return self._held.get(endpoint, 0)

    def has_room(self, endpoint: str, priority: int = 0) -> bool:
        return self._held.get(endpoint, 0) < self.max_per_endpoint

    def with_room(self, endpoints: Sequence[E], priority: int = 0) -> Sequence[E]:
        limit = self.max_per_endpoint
        if len(self._holders) < limit:
            return endpoints  # fewer in their prefill than one endpoint's limit: none is full
        held = self._held
        return [e for e in endpoints if held.get(e.address, 0) < limit]

    def may_have_room(self, endpoints: Sequence[Addressed], priority: int = 0) -> bool:
        return True

    def is_open(self, priority: int) -> bool:
        return True

    def on_dispatch(self, request: FlowRequest) -> None:
        endpoint = prefiller_of(request)
        if endpoint is not None:
            self._holders[request] = endpoint
            self._held[endpoint] = self._held.get(endpoint, 0) + 1

    def on_complete(self, request: FlowRequest) -> None:
        self.release(request)

    def holds(self, request: FlowRequest) -> bool:
        """Whether `request` holds a prefill credit now."""
        return request in self._holders

    def release(self, request: FlowRequest) -> bool:
        """`request`'s prefill is over; whether it held a credit (then the
        core may dispatch more)."""
        endpoint = self._holders.pop(request, None)
        if endpoint is None:
            return False
        left = self._held[endpoint] - 1
        if left:
            self._held[endpoint] = left
        else:
            del self._held[endpoint]
        return True


def stage_gate(
    gate: Gate, max_per_prefill_endpoint: int, scheduling: SchedulingConfig
) -> tuple[Gate, PrefillCredits | None]:
    """`gate` with prefill credits beside it when `scheduling`
    disaggregates and the prefill stage is bounded."""
    if not disaggregates(scheduling) or max_per_prefill_endpoint <= 0:
        return gate, None
    credits = PrefillCredits(max_per_prefill_endpoint)
    return AllGates((*gate_parts(gate), credits)), credits
