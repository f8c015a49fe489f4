"""What a simulation records over its run for the report and the plots,
besides each request's own times: periodic samples of the tenants and of
the EPP (`Samples`), and, when asked, the servers' idle capacity while the
policy queues (`IdleCapacity`, work conservation).

Both are taken at events the engine already has (a SAMPLE every
`duration_s / samples`, each scrape), never per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.sim.requests import Policy, SimRequest
from epp.sim.server_model import ModelServer


class Samples:
    """Each tenant's waiting requests and attained service, the policy's
    queue by priority and its learned limits, at each sample time."""

    __slots__ = ("limits", "queued", "service", "times", "waiting")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.waiting: list[list[int]] = []
        self.service: list[list[float]] = []
        self.queued: list[dict[int, int]] = []
        self.limits: list[dict[str, int]] = []

    def take(self, when: float, waiting: list[int], service: list[float], policy: Policy) -> None:
        """One sample at `when` of the per-tenant counts (copied) and the policy."""
        self.times.append(when)
        self.waiting.append(list(waiting))
        self.service.append(list(service))
        self.queued.append(policy.queued_by_priority())
        self.limits.append(policy.limits())


class IdleCapacity:
    """Work conservation, sampled at each scrape: while the policy holds
    requests queued, a live server with nothing waiting that could admit a
    request of the workload's mean size (a batch slot and its KV blocks
    free) idles capacity for the scrape interval."""

    __slots__ = ("_run", "_tokens", "longest_s", "seconds")

    def __init__(self, servers: int, requests: Sequence[SimRequest]) -> None:
        self.seconds = [0.0] * servers
        """Per server, the seconds it could have run one more request."""
        self.longest_s = [0.0] * servers
        """Per server, the longest such stretch."""
        self._run = [0.0] * servers
        self._tokens = (
            sum(r.prompt_tokens + r.output_tokens for r in requests) / len(requests)
            if requests
            else 0.0
        )

    def measure(
        self, servers: Sequence[ModelServer], up: Sequence[bool], queued: bool, interval: float
    ) -> None:
        """One scrape `interval` of each server (`queued`: the policy holds requests)."""
        idle, runs, longest = self.seconds, self._run, self.longest_s
        tokens = self._tokens
        for index, server in enumerate(servers):
            if queued and up[index] and server.could_admit(tokens):
                idle[index] += interval
                runs[index] += interval
                if runs[index] > longest[index]:
                    longest[index] = runs[index]
            else:
                runs[index] = 0.0
