"""One live run of a scenario: the stack up, the load through Envoy, the report.

The scenario's pool becomes simulated model servers (its `pool` parameters),
its objectives and EPP configuration go to `epp serve`, and its tenants are
played in real time through a real Envoy. Server events (`events:`) are a
simulator feature and are not played live.

A scenario with `pool.roles` runs disaggregated: the decode servers behind
their routing sidecars, the KV pull priced by `kv_transfer`, and the report
gains `stages`: the EPP's disaggregation decisions (from its /metrics) and
the remote prefills the servers ran (from theirs), which must agree.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epp.demo.loadgen import LoadGenerator
from epp.demo.loadwatch import LoadWatch, summarize
from epp.demo.report import live_report
from epp.demo.stack import LiveStack, StackSettings, live_stack
from epp.flowcontrol.config import effective_ttl
from epp.sim.scenario import Scenario
from epp.sim.workload import Arrived

DRAIN_TIMEOUT_S = 60.0
"""Room in the client's timeout beyond the longest queue wait and service:
for a request's wait at its server's own queue."""


def client_timeout(scenario: Scenario, arrivals: Sequence[Arrived]) -> float:
    """When the load generator gives a request up: after the longest the EPP
    may keep it queued (its effective TTL: its tenant's, its band's, the
    default; none: the simulator's horizon, the run and its drain), plus
    the longest service on the slowest server with a full batch (the
    longest prompt and the longest output), plus
    `DRAIN_TIMEOUT_S`. So a request the EPP keeps waiting ends with the
    EPP's outcome (an expiry) live, as in the simulator, not as a client
    timeout."""
    flow = scenario.epp_config.flow_control
    waits = [
        effective_ttl(
            tenant.ttl_s, flow.default_ttl, flow.band(scenario.priority_of(tenant.objective)).ttl
        )
        for tenant in scenario.tenants
    ]
    horizon = scenario.duration_s + scenario.drain_s
    wait = max(horizon if ttl is None else ttl for ttl in waits) if waits else 0.0
    prompt = max((arrived.prompt_tokens for arrived in arrivals), default=0)
    output = max((arrived.output_tokens for arrived in arrivals), default=0)
    service = max(
        (
            params.prefill_overhead_ms
            + params.prefill_ms_per_token * prompt
            + params.decode_ms_per_token
            * (1 + params.decode_batch_growth * params.max_num_seqs)
            * output
        )
        / 1000
        for params in scenario.pool.server_params
    )
    return wait + service + DRAIN_TIMEOUT_S


@dataclass(slots=True, frozen=True)
class DemoRun:
    report: dict[str, Any]
    epp_crashed: bool


def stack_settings(scenario: Scenario, engine: str = "vllm") -> StackSettings:
    pool = scenario.pool
    return StackSettings(
        servers=pool.servers,
        params=pool.params,
        objectives=scenario.objectives,
        epp_config=scenario.epp_config_path,
        model=scenario.model,
        engine=engine,
        scrape_interval_s=pool.scrape_interval_s,
        roles=pool.roles,
        kv_transfer=scenario.kv_transfer,
    )


def describe(stack: LiveStack) -> str:
    assert stack.epp is not None and stack.envoy is not None
    return (
        f"model servers: {', '.join(stack.servers)}\n"
        + (f"routing sidecars: {', '.join(stack.endpoints)}\n" if stack.sidecars else "")
        + f"epp serve: pid {stack.epp.pid}, ext_proc 127.0.0.1:{stack.epp_port}, "
        f"metrics {stack.epp_metrics_url}\n"
        f"envoy: {stack.envoy.url} (admin {stack.envoy.admin_url})"
    )


async def run_demo(scenario: Scenario, say=print, engine: str = "vllm") -> DemoRun:
    """Start everything, play the scenario, stop everything; the report, with
    what the EPP saw of the servers' load (`epp.demo.loadwatch`)."""
    settings = stack_settings(scenario, engine)
    async with live_stack(settings) as stack:
        say(describe(stack))
        say(f"playing {scenario.name!r} for {scenario.duration_s:g} s through Envoy ...")
        started = time.monotonic()
        async with LoadWatch(stack.endpoints, engine, stack.epp_metrics_url) as watch:
            requests = await LoadGenerator(
                stack.envoy.url if stack.envoy else "", scenario, timeout=DRAIN_TIMEOUT_S
            ).run()
        wall = time.monotonic() - started
        crashed = stack.epp_crashed()
        stages = await read_stages(stack) if scenario.pool.roles else None
    report = live_report(scenario, requests, wall, scenario.epp_config_path)
    report["scenario"]["engine"] = engine
    report["load_view"] = summarize(watch.samples, settings.scrape_interval_s)
    if stages is not None:
        report["policies"]["epp"]["stages"] = stages
    return DemoRun(report, crashed)


def sum_of(text: str, family_name: str, by: str | None = None) -> dict[str, float]:
    """The `_total` samples of counter `family_name` summed (by label `by`)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = sample.labels.get(by, "") if by else ""
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


async def read_stages(stack: LiveStack) -> dict[str, Any]:
    """The EPP's disaggregation decisions and the remote prefills the servers ran."""
    async with aiohttp.ClientSession() as session:
        async with session.get(stack.epp_metrics_url) as response:
            decisions = sum_of(await response.text(), "llm_d_epp_disagg_decision", "decision_type")
        prefills = 0.0
        for server in stack.servers:
            async with session.get(f"http://{server}/metrics") as response:
                prefills += sum_of(await response.text(), "epp_sim_remote_prefills").get("", 0.0)
    decided = sum(decisions.values())
    remote = decisions.get("prefill-decode", 0.0) + decisions.get("encode-prefill-decode", 0.0)
    return {
        "decisions": {kind: int(count) for kind, count in sorted(decisions.items())},
        "disaggregated_share": remote / decided if decided else 0.0,
        "remote_prefills_run": int(prefills),
    }
