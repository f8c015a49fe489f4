"""`epp demo --compare`: the scenario played live once per policy, side by side.

The policies are the simulator's: the scenario's configuration (`epp`), each
variant that names a configuration file, and round-robin when the scenario
lists it among its baselines (the load sent to the servers in turn, past
the EPP, as a Kubernetes Service would). Every policy gets fresh servers
and the same arrivals.

When a policy's configuration has the precise prefix cache
(`precise-prefix-cache-producer`), every run's servers publish their
KV-cache events (each on a loopback address of its own, as pods have) and
tokenize with one tokenizer.json trained on the run's prompts
(`tokenizer_file`), so the hit rates compare; the configuration gets what a
deployment fills in (`deployed_config`): the token producer's model (its
local backend on that model directory, or a render URL) and the servers'
events port.

Reported per policy: the prefix-cache hit rate (the servers' own
`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`),
TTFT p50 and p90 of the completed requests, and completed of sent.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from epp.demo.demo import DRAIN_TIMEOUT_S, stack_settings, sum_of
from epp.demo.kv_publisher import port_free_on_every
from epp.demo.loadgen import LoadGenerator, prompt_text
from epp.demo.report import live_report
from epp.demo.stack import event_hosts, live_stack
from epp.demo.tokenizer_file import train
from epp.sim.scenario import Scenario
from epp.sim.workload import workload

PRECISE_PRODUCER = "precise-prefix-cache-producer"
ROUND_ROBIN = "round-robin"
CORPUS_PROMPTS = 200
"""Prompts the tokenizer is trained on (the first of the run's)."""


def is_precise(config: str | None) -> bool:
    if config is None:
        return False
    document = yaml.safe_load(Path(config).read_text()) or {}
    return any(plugin.get("type") == PRECISE_PRODUCER for plugin in document.get("plugins", []))


def deployed_config(
    source: Path,
    folder: Path,
    model: str,
    events_port: int,
    tokenizer: Path | None = None,
    render_url: str = "",
) -> Path:
    """`source` with what a deployment fills in: the token producer's model,
    its local backend on `tokenizer` (else its vllm backend at
    `render_url`), and the servers' KV-events port; written into `folder`."""
    config = yaml.safe_load(source.read_text())
    for plugin in config["plugins"]:
        parameters = plugin.setdefault("parameters", {}) or {}
        plugin["parameters"] = parameters
        if plugin["type"] in ("token-producer", "tokenizer"):
            parameters["modelName"] = model
            vllm = parameters.pop("vllm", None) or {}
            if tokenizer is not None:
                local = {"modelDir": str(tokenizer)}
                if "timeout" in vllm:
                    local["timeout"] = vllm["timeout"]
                parameters["local"] = local
            else:
                parameters["vllm"] = {**vllm, "url": render_url}
        if plugin["type"] == PRECISE_PRODUCER:
            events = parameters.setdefault("kvEventsConfig", {})
            events.pop("zmqEndpoint", None)
            events["discoverPods"] = True
            events.setdefault("podDiscoveryConfig", {})["socketPort"] = events_port
    path = folder / f"deployed-{source.stem}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def policies(scenario: Scenario) -> list[tuple[str, str | None]]:
    """(name, configuration file) of each policy; round-robin has none."""
    chosen: list[tuple[str, str | None]] = [("epp", scenario.epp_config_path)]
    chosen += [(v.name, v.config_path) for v in scenario.variants if v.config_path is not None]
    if ROUND_ROBIN in scenario.baselines:
        chosen.append((ROUND_ROBIN, None))
    return chosen


async def prefix_hit_rate(servers: list[str]) -> float | None:
    """The servers' cached prompt tokens over their prompt tokens."""
    queries = hits = 0.0
    async with aiohttp.ClientSession() as session:
        for server in servers:
            async with session.get(f"http://{server}/metrics") as response:
                text = await response.text()
            queries += sum_of(text, "vllm:prefix_cache_queries").get("", 0.0)
            hits += sum_of(text, "vllm:prefix_cache_hits").get("", 0.0)
    return hits / queries if queries else None


async def run_compare(
    scenario: Scenario, say: Callable[[str], object] = print, engine: str = "vllm"
) -> dict[str, Any]:
    """Each policy's run (module docstring), as `epp simulate`'s report."""
    arrivals = list(workload(scenario))
    chosen = policies(scenario)
    precise = any(is_precise(config) for _, config in chosen)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="epp-compare-") as work:
        folder = Path(work)
        tokenizer = None
        if precise:
            say("training a tokenizer on the run's prompts ...")
            corpus = [
                prompt_text(scenario.tenants[a.tenant], number, a.prompt_tokens)
                for number, a in enumerate(arrivals[:CORPUS_PROMPTS])
            ]
            tokenizer = train(folder / "tokenizer", corpus)
        base = stack_settings(scenario, engine)
        for name, config in chosen:
            settings = dataclasses.replace(base, epp_config=config, tokenizer=tokenizer)
            if precise:
                port = port_free_on_every(event_hosts(settings.servers))
                settings = dataclasses.replace(settings, kv_events_port=port)
                if is_precise(config):
                    assert config is not None
                    deployed = deployed_config(
                        Path(config), folder, scenario.model, port, tokenizer
                    )
                    settings = dataclasses.replace(settings, epp_config=str(deployed))
            say(f"{name}: playing {scenario.name!r} for {scenario.duration_s:g} s ...")
            async with live_stack(settings) as stack:
                if name == ROUND_ROBIN:
                    urls = [f"http://{server}" for server in stack.servers]
                else:
                    assert stack.envoy is not None
                    urls = [stack.envoy.url]
                requests = await LoadGenerator(
                    urls, scenario, arrivals, timeout=DRAIN_TIMEOUT_S
                ).run()
                hit_rate = await prefix_hit_rate(stack.servers)
            run = live_report(scenario, requests, 0.0, config)
            report.setdefault("scenario", run["scenario"])
            policy = run["policies"]["epp"]
            policy["prefix_cache_hit_rate"] = hit_rate
            report.setdefault("policies", {})[name] = policy
    return report


def render_compare(report: dict[str, Any]) -> str:
    """One line per policy: hit rate, TTFT p50 and p90, completed of sent."""
    lines = [f"{'policy':<16} {'hit rate':>9} {'ttft50':>9} {'ttft90':>9}  completed"]
    for name, policy in report["policies"].items():
        hit = policy.get("prefix_cache_hit_rate")
        p50, p90 = policy.get("ttft_p50_s"), policy.get("ttft_p90_s")
        lines.append(
            f"{name:<16} {'-' if hit is None else f'{hit:.1%}':>9} "
            f"{'-' if p50 is None else f'{p50 * 1e3:.0f} ms':>9} "
            f"{'-' if p90 is None else f'{p90 * 1e3:.0f} ms':>9}  "
            f"{policy['completed']}/{policy['requests']}"
        )
    return "\n".join(lines)
