"""A priority band: the flows of one priority, their counts and their policy."""

from __future__ import annotations

from collections import deque
from math import inf

from epp.flowcontrol.config import BandConfig, Ordering, effective_ttl
from epp.flowcontrol.fairness import FairnessPolicy, make_policy
from epp.flowcontrol.flow import Flow
from epp.flowcontrol.ordering import order_key
from epp.flowcontrol.request import FlowRequest


class Band:
    """Limits are kept ready for the hot path: `max_requests` and `max_bytes`
    are infinite when unlimited, `ttl` is the smaller of the default and the
    band's TTL (None when neither limits), `fcfs` says no order key is needed."""

    __slots__ = (
        "bytes",
        "config",
        "count",
        "fcfs",
        "flows",
        "keep",
        "lane",
        "max_bytes",
        "max_requests",
        "policy",
        "priority",
        "ttl",
    )

    def __init__(
        self, config: BandConfig, default_ttl: float, keep: bool, lane: deque[FlowRequest]
    ) -> None:
        self.priority = config.priority
        self.policy: FairnessPolicy = make_policy(config)
        self.flows: dict[str, Flow] = {}
        self.count = 0
        self.bytes = 0
        self.keep = keep
        """Configured or announced bands stay when they have no flows left."""
        self.lane = lane
        """The deadline lane of requests that take the band's TTL."""
        self._apply(config, default_ttl)

    def _apply(self, config: BandConfig, default_ttl: float) -> None:
        self.config = config
        self.max_requests = config.max_requests or inf
        self.max_bytes = config.max_bytes or inf
        self.ttl = effective_ttl(default_ttl, config.ttl)
        self.fcfs = config.ordering is Ordering.FCFS

    def flow(self, fairness_id: str) -> Flow:
        flow = self.flows.get(fairness_id)
        if flow is None:
            flow = self.flows[fairness_id] = Flow(fairness_id, self)
        return flow

    def reconfigure(self, config: BandConfig, default_ttl: float) -> None:
        """Take the new configuration. When the policy changes, queued requests
        move to the new one, keeping their arrival order within each flow."""
        old = self.config
        self._apply(config, default_ttl)
        if _policy_settings(old) == _policy_settings(config):
            return
        queued: list[FlowRequest] = self.policy.requests()
        self.policy = policy = make_policy(config)
        for flow in self.flows.values():
            flow.count = 0
            policy.adopt(flow)
        for request in queued:
            request.prev = request.next = None
            request.order_key = order_key(config.ordering, request)
            flow = request.flow
            flow.count += 1
            policy.push(request, flow)


def _policy_settings(config: BandConfig) -> tuple:
    return (
        config.fairness,
        config.ordering,
        config.input_weight,
        config.output_weight,
        config.program_aware,
    )
