"""One live run of a scenario: the stack up, the load through Envoy, the report.

The scenario's pool becomes simulated model servers (its `pool` parameters),
its objectives and EPP configuration go to `epp serve`, and its tenants are
played in real time through a real Envoy. Server events (`events:`) are a
simulator feature and are not played live.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from epp.demo.loadgen import LoadGenerator
from epp.demo.loadwatch import LoadWatch, summarize
from epp.demo.report import live_report
from epp.demo.stack import LiveStack, StackSettings, live_stack
from epp.sim.scenario import Scenario

DRAIN_TIMEOUT_S = 60.0
"""Every request is given up this long after it was sent."""


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
    )


def describe(stack: LiveStack) -> str:
    assert stack.epp is not None and stack.envoy is not None
    return (
        f"model servers: {', '.join(stack.endpoints)}\n"
        f"epp serve: pid {stack.epp.pid}, ext_proc 127.0.0.1:{stack.epp_port}, "
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
    report = live_report(scenario, requests, wall, scenario.epp_config_path)
    report["scenario"]["engine"] = engine
    report["load_view"] = summarize(watch.samples, settings.scrape_interval_s)
    return DemoRun(report, crashed)
