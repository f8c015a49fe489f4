"""Plays a scenario's tenants in real time against an HTTP endpoint (Envoy).

The requests are the simulator's (`epp.sim.workload.workload`: the same
arrival times and token counts a simulated run of the scenario sees), sent
at their arrival times with the tenant's objective and fairness-id headers,
streaming or not. Prompts are the simulator's too (`prompt_text`): the
tenant's shared prefix, if any, then text of the request's own, so that the
EPP's prefix-cache scorer finds the matches it finds in a simulation and no
others. Each request ends as one `LiveRequest`: its timings and
an `outcome`, which is `completed` (200 and a whole body), the EPP's drop
reason (`x-llm-d-request-dropped-reason`, e.g. `rejected-saturated`),
`http-NNN` for another status, or `error: ...` when no response came (a
connection reset or the per-request timeout).

The run is bounded: at most `max_requests` requests, none sent after
`duration`, and every request is given up at `timeout` seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from epp.extproc.headers import DROPPED_REASON, FAIRNESS_ID, OBJECTIVE, REQUEST_ID, TTL
from epp.sim.policies import prefix_text
from epp.sim.scenario import Scenario, Tenant
from epp.sim.workload import Arrived, workload

COMPLETED = "completed"


@dataclass(slots=True, eq=False)
class LiveRequest:
    """One request as the client saw it. Times are seconds since the run
    started; the attribute names match the simulator's requests, so the
    simulator's statistics read these too."""

    tenant: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    sent_at: float | None = None
    """When the generator began sending it; `sent_at - arrival` is its lateness."""
    status: int = 0
    outcome: str | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    request_id: str = ""
    """Its `x-request-id` (Envoy keeps it, the EPP and the server see it)."""

    @property
    def answered(self) -> bool:
        """An HTTP response came back (whatever its status)."""
        return self.status != 0


def prompt_text(tenant: Tenant, number: int, prompt_tokens: int) -> str:
    """The prompt the simulator models for request `number` of `tenant`:
    the tenant's shared prefix (`prefix_text`), if it has one, then text of
    the request's own from the first character on, so that no block of it
    matches another request's (as `PromptBlocks` hashes it). Four characters
    a token, as the model servers count."""
    shared = min(tenant.prefix_tokens, prompt_tokens) if tenant.prefix_group else 0
    own = prefix_text(f"{tenant.name}#{number}", prompt_tokens - shared)
    return (prefix_text(tenant.prefix_group, shared) if shared else "") + own


def request_body(model: str, prompt: str, output_tokens: int, stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def request_headers(tenant: Tenant, request_id: str) -> dict[str, str]:
    headers = {
        "content-type": "application/json",
        REQUEST_ID: request_id,
        OBJECTIVE[0]: tenant.objective,
        FAIRNESS_ID[0]: tenant.fairness_id,
    }
    if tenant.ttl_s is not None:
        headers[TTL[0]] = f"{tenant.ttl_s:g}s"
    return headers


def outcome_of(status: int, dropped_reason: str | None) -> str:
    if status == 200:
        return COMPLETED
    return dropped_reason or f"http-{status}"


class LoadGenerator:
    """See the module docstring. `run()` returns every request it sent."""

    def __init__(
        self,
        url: str | Sequence[str],
        scenario: Scenario,
        arrivals: Sequence[Arrived] | None = None,
        max_requests: int = 100_000,
        timeout: float = 120.0,
        path: str = "/v1/completions",
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        self.urls = [each.rstrip("/") + path for each in urls]
        """Where requests go, in turn (several: round robin, as a Service)."""
        self.scenario = scenario
        self.arrivals = list(workload(scenario) if arrivals is None else arrivals)[:max_requests]
        self.timeout = timeout
        self.requests: list[LiveRequest] = []
        self.origin = 0.0
        """The event loop's time (`time.monotonic()` under asyncio's loop) at
        which the run started: every request's times are relative to it."""

    async def run(self) -> list[LiveRequest]:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            start = self.origin = loop.time()
            tasks: list[asyncio.Task[None]] = []
            try:
                for number, arrived in enumerate(self.arrivals):
                    delay = start + arrived.time - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    request = LiveRequest(
                        arrived.tenant,
                        arrived.time,
                        arrived.prompt_tokens,
                        arrived.output_tokens,
                        request_id=f"loadgen-{number}",
                    )
                    self.requests.append(request)
                    tasks.append(asyncio.create_task(self._send(session, request, number, start)))
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return self.requests

    async def _send(
        self, session: aiohttp.ClientSession, request: LiveRequest, number: int, start: float
    ):
        loop = asyncio.get_running_loop()
        request.sent_at = loop.time() - start
        tenant = self.scenario.tenants[request.tenant]
        prompt = prompt_text(tenant, number, request.prompt_tokens)
        body = request_body(self.scenario.model, prompt, request.output_tokens, tenant.stream)
        try:
            async with session.post(
                self.urls[number % len(self.urls)],
                data=body,
                headers=request_headers(tenant, request.request_id),
            ) as response:
                request.status = response.status
                if response.status != 200:
                    await response.read()
                    request.outcome = outcome_of(
                        response.status, response.headers.get(DROPPED_REASON)
                    )
                    return
                if tenant.stream:
                    async for line in response.content:
                        if request.first_token_at is None and line.startswith(b"data: {"):
                            request.first_token_at = loop.time() - start
                else:
                    await response.read()
                    request.first_token_at = loop.time() - start
                request.finished_at = loop.time() - start
                request.outcome = COMPLETED
        except (aiohttp.ClientError, TimeoutError) as error:
            request.outcome = f"error: {type(error).__name__}"
