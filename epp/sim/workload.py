"""Arrivals and request sizes drawn from a scenario's tenants.

Each tenant draws from its own `random.Random`, seeded with the scenario
seed and the tenant's name, so a tenant's requests do not change when other
tenants are added or removed, and the run of a tier alone (for isolation)
sees exactly the requests it saw in the full run.

A tenant with a prefix group sends `prefix.tokens` shared tokens followed by
`prompt_tokens` tokens of its own. A tenant with a `conversation` starts one
at each arrival and sends its turns `think_s` apart (while the run lasts):
turn k's prompt is the prefix, every earlier turn's message and reply, and
its own message of `prompt_tokens` tokens (open loop: a turn does not wait
for the previous reply).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from epp.sim.scenario import Arrival, Lengths, Scenario, Tenant


@dataclass(slots=True, frozen=True)
class Arrived:
    """One request of the workload, before any policy touched it."""

    time: float
    tenant: int
    prompt_tokens: int
    output_tokens: int
    conversation: int = -1
    """The conversation it is a turn of (unique in the workload), or -1."""


CONVERSATIONS_PER_TENANT = 1 << 32
"""Conversation numbers are tenant x this + the tenant's own count, so a
tenant's conversations keep their numbers when it runs alone."""


def arrival_times(
    tenant: Tenant, arrival: Arrival, duration: float, rng: random.Random
) -> list[float]:
    """The tenant's arrival times in [0, duration)."""
    rate = tenant.rate_rps
    kind = arrival.kind
    times: list[float] = []
    if kind == "trace":
        assert tenant.trace is not None
        return [t for t in tenant.trace.times if 0 <= t < duration]
    if kind == "constant":
        step = 1.0 / rate
        t = rng.random() * step
        while t < duration:
            times.append(t)
            t += step
        return times
    if kind == "poisson":
        t = rng.expovariate(rate)
        while t < duration:
            times.append(t)
            t += rng.expovariate(rate)
        return times
    if kind == "bursts":
        period = arrival.on_s + arrival.off_s
        on_time = rng.expovariate(rate)
        while True:
            cycles, within = divmod(on_time, arrival.on_s)
            t = cycles * period + within
            if t >= duration:
                return times
            times.append(t)
            on_time += rng.expovariate(rate)
    # ramp: thinning of a Poisson process at the highest rate
    low, high = arrival.from_rps, arrival.to_rps
    peak = max(low, high)
    if peak <= 0:
        return times
    t = rng.expovariate(peak)
    while t < duration:
        if rng.random() * peak < low + (high - low) * t / duration:
            times.append(t)
        t += rng.expovariate(peak)
    return times


def draw_length(lengths: Lengths, rng: random.Random) -> int:
    kind = lengths.kind
    if kind == "constant":
        return int(lengths.a)
    if kind == "uniform":
        return rng.randint(int(lengths.a), int(lengths.b))
    mean, sigma = lengths.a, lengths.b
    mu = math.log(mean) - sigma * sigma / 2.0
    return max(1, round(rng.lognormvariate(mu, sigma)))


def conversation_turns(
    scenario: Scenario, index: int, starts: list[float], rng: random.Random
) -> list[Arrived]:
    """The turns of the conversations tenant `index` starts at `starts`."""
    tenant = scenario.tenants[index]
    chat = tenant.conversation
    assert chat is not None
    turns = []
    for number, start in enumerate(starts):
        conversation = index * CONVERSATIONS_PER_TENANT + number
        history = tenant.prefix_tokens
        for turn in range(chat.turns):
            at = start + turn * chat.think_s
            if at >= scenario.duration_s:
                break
            message = draw_length(tenant.prompt_tokens, rng)
            reply = draw_length(tenant.output_tokens, rng)
            turns.append(Arrived(at, index, history + message, reply, conversation))
            history += message + reply
    turns.sort(key=lambda request: request.time)
    return turns


def tenant_requests(scenario: Scenario, index: int) -> list[Arrived]:
    tenant = scenario.tenants[index]
    rng = random.Random(f"{scenario.seed}/{tenant.name}")
    times = arrival_times(tenant, tenant.arrival, scenario.duration_s, rng)
    if tenant.conversation is not None:
        return conversation_turns(scenario, index, times, rng)
    trace = tenant.trace
    prompt, output = tenant.prompt_tokens, tenant.output_tokens
    arrived = []
    for row, time in enumerate(times):
        prompt_tokens = (
            trace.prompt_tokens[row]
            if prompt.kind == "trace" and trace is not None
            else draw_length(prompt, rng)
        )
        output_tokens = (
            trace.output_tokens[row]
            if output.kind == "trace" and trace is not None
            else draw_length(output, rng)
        )
        arrived.append(Arrived(time, index, prompt_tokens + tenant.prefix_tokens, output_tokens))
    return arrived


def workload(scenario: Scenario) -> list[Arrived]:
    """Every tenant's requests, in arrival order (ties by tenant order)."""
    merged = [
        request
        for index in range(len(scenario.tenants))
        for request in tenant_requests(scenario, index)
    ]
    merged.sort(key=lambda request: (request.time, request.tenant))
    return merged
