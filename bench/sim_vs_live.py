"""The simulator against the live system: `python -m bench.sim_vs_live [SCENARIO] [--json]`.

Plays one scenario (default `config/scenarios/demo.yaml`) twice over the
same arrivals (the scenario's seed): live, as `epp demo` does (simulated
vLLM servers over HTTP, a real Envoy, `epp serve`), and in `epp simulate`'s
engine under ours. Prints per objective the two sides' TTFT quantiles and
outcome counts and the ratios live / sim:

    {"objectives": {NAME: {"sim": {...}, "live": {...}, "ttft_p50_ratio": ...,
     "ttft_p90_ratio": ..., "completed_ratio": ..., "rejected_ratio": ...}}, ...}

Target: both TTFT ratios of every objective within [0.85, 1.18], every
`completed_ratio` within [0.95, 1.05].

The sim side is an ensemble, not one run. The simulator is deterministic;
the live system is not: each request leaves the load generator a little
late (measured here, `live.loadgen_late_ms`) and crosses Envoy and the EPP
in a few milliseconds more or less, and in an overloaded pool a millisecond
decides which request takes the next free slot, so every tier's tail is one
history out of many. One simulated history is as much a sample as the live
one (see bench/README.md for how far a tier's p90 moves between them). So
the simulator runs `--sim-runs` times, each with every arrival delayed by a
lateness drawn (seeded) from the live run's own measured lateness, and its
quantiles are over the requests of all runs; `*_range` gives the lowest and
highest value of single runs. `sim_single` is the plain run, arrivals exactly
on time, as `epp simulate` reports it.

The live side is one run on a shared machine: `live.loadgen_late_ms` and
`machine.load_average` show how busy it was; `warnings` says when the load
generator was late enough (p99 above 20 ms) that the run measured the
machine rather than the system.

What is not played live is left out of both sides: server events
(`events:`), with a warning. The live servers cache no prompt prefix and
load no LoRA adapter, so scenarios with prefix groups or adapters differ by
design (warned).

TTFT counts from when the load generator sent a request (the simulated
arrivals carry the same lateness). Each tier's TTFT is also given in parts
(`ttft_parts_ms`, p50 and p90): to the server, in the server, the server
model's own time of it, back to the client. Where the two sides' `model`
parts agree and the others do not, the difference is the path (Envoy, the
EPP, the model server's handler), not the server model.

The path is a machine's: on a busy one every hop waits for a CPU and the
path grows to two or three times `pool.path_ms`. `--path live` gives the
simulator the path the live run measured (`live.path_ms.to_model` and
`from_model`), so the comparison judges the EPP's decisions and the server
model alone.

`--duration` plays the scenario's load for that long (default 180 s, a few
minutes: a tier's p90 over 30 s rests on a handful of requests).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.gateway_path import Served, measured_path, play_timed, read_server_log
from epp.demo.loadgen import COMPLETED, LiveRequest
from epp.sim.requests import SERVER_REJECTED, SimRequest
from epp.sim.runner import simulate
from epp.sim.scenario import PathDelay, Scenario
from epp.sim.scenario_file import ScenarioError, load_scenario
from epp.sim.workload import Arrived, workload

DEFAULT_SCENARIO = Path(__file__).resolve().parents[1] / "config" / "scenarios" / "demo.yaml"
DEFAULT_DURATION_S = 180.0
DEFAULT_SIM_RUNS = 8
TTFT_TARGET = (0.85, 1.18)
COMPLETED_TARGET = (0.95, 1.05)
STARVED_LATE_MS = 20.0
"""A load generator this late at p99 was short of CPU: the run is not a measurement."""
FEW_COMPLETED = 30
"""A tier that completes fewer requests live has a p90 of two or three of
them: its TTFT ratios are one history's luck, and a warning says so."""
LIVE_SERVER_REJECTED = "http-429"


def is_rejected(outcome: str | None) -> bool:
    """A drop by the EPP (its reason) or by a server's full waiting queue."""
    return outcome is not None and (
        outcome.startswith("rejected-") or outcome in (SERVER_REJECTED, LIVE_SERVER_REJECTED)
    )


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"ttft_p50_s": None, "ttft_p90_s": None, "ttft_p99_s": None}
    p50, p90, p99 = np.percentile(np.asarray(values), (50, 90, 99))
    return {"ttft_p50_s": float(p50), "ttft_p90_s": float(p90), "ttft_p99_s": float(p99)}


def side_stats(
    requests: Sequence[Any],
    first_byte: Callable[[Any], float],
    sent: Callable[[Any], float],
    runs: int = 1,
) -> dict[str, Any]:
    """Counts (per run, averaged over `runs`) and TTFT quantiles (over all
    requests, TTFT as the client sees it: `first_byte(r) - sent(r)`)."""
    done = [r for r in requests if r.outcome == COMPLETED]
    outcomes: dict[str, float] = {}
    for request in requests:
        outcomes[request.outcome] = outcomes.get(request.outcome, 0) + 1
    return {
        "requests": len(requests) / runs,
        "completed": len(done) / runs,
        "rejected": sum(1 for r in requests if is_rejected(r.outcome)) / runs,
        **quantiles([first_byte(r) - sent(r) for r in done]),
        "outcomes": {k: v / runs for k, v in sorted(outcomes.items())},
    }


def live_first_byte(request: LiveRequest) -> float:
    return request.first_token_at  # type: ignore[return-value]


def live_sent(request: LiveRequest) -> float:
    """When the load generator sent it: its lateness is the generator's, not
    the system's (the simulated arrivals carry the same lateness)."""
    return request.sent_at  # type: ignore[return-value]


def sim_sent(request: SimRequest) -> float:
    return request.arrival


def sim_first_byte(scenario: Scenario) -> Callable[[SimRequest], float]:
    """When a simulated request's client sees its first token: at the first
    token when its tenant streams, with the whole response when not (as the
    live client, and `epp demo`'s report, count it)."""
    streams = [t.stream for t in scenario.tenants]

    def first_byte(request: SimRequest) -> float:
        if streams[request.tenant]:
            return request.first_token_at  # type: ignore[return-value]
        return request.finished_at  # type: ignore[return-value]

    return first_byte


def ratio(live: float | None, sim: float | None) -> float | None:
    """live / sim; 1 when both are 0; None when only sim is 0 or either is unknown."""
    if live is None or sim is None:
        return None
    if sim == 0:
        return 1.0 if live == 0 else None
    return live / sim


def within(value: float | None, bounds: tuple[float, float]) -> bool:
    return value is not None and bounds[0] <= value <= bounds[1]


def comparable(scenario: Scenario, duration_s: float) -> tuple[Scenario, list[str]]:
    """The scenario as both sides can play it, and what was changed or differs.
    A pool of several server groups cannot be played live (ScenarioError)."""
    if len(scenario.pool.groups) > 1:
        raise ScenarioError(
            ["pool.groups: a pool of several server groups runs only in the simulator"],
            scenario.name,
        )
    notes = []
    if scenario.events:
        notes.append("server events are not played live: left out of both sides")
    if any(t.prefix_group for t in scenario.tenants):
        notes.append(
            "prefix groups: the live EPP sees the shared prefixes, but the live servers "
            "cache no prefix (every prompt is prefilled whole)"
        )
    if any(t.lora for t in scenario.tenants):
        notes.append("LoRA adapters are not played live")
    played = dataclasses.replace(
        scenario, duration_s=duration_s, events=(), baselines=(), variants=(), isolation=False
    )
    return played, notes


def late_arrivals(arrivals: list[Arrived], lateness: Sequence[float], seed: int) -> list[Arrived]:
    """`arrivals`, each delayed by a lateness drawn from `lateness`, in time order."""
    rng = random.Random(seed)
    late = [dataclasses.replace(a, time=a.time + rng.choice(lateness)) for a in arrivals]
    late.sort(key=lambda a: (a.time, a.tenant))
    return late


@dataclass(slots=True)
class LiveRun:
    requests: list[LiveRequest]
    wall_s: float
    path_ms: dict[str, Any]
    """The Envoy + EPP path measured per request (`bench.gateway_path`)."""
    served: dict[str, Served]
    """The servers' timing log by request id, in `time.monotonic()` seconds."""
    origin: float
    """The load generator's time 0, in `time.monotonic()` seconds."""


def play_live(scenario: Scenario, arrivals: list[Arrived]) -> LiveRun:
    with tempfile.TemporaryDirectory(prefix="epp-sim-vs-live-") as directory:
        started = time.monotonic()
        requests, origin, *logs = asyncio.run(play_timed(scenario, arrivals, Path(directory)))
        wall = time.monotonic() - started
        path = measured_path(scenario, requests, origin, (logs[0], logs[1]))
        return LiveRun(requests, wall, path, read_server_log(logs[1]), origin)


PARTS = ("to_server", "in_server", "model", "back")
"""A completed request's TTFT in parts (`ttft_parts`)."""


def live_parts(run: LiveRun, streamed: Sequence[bool]) -> Callable[[LiveRequest], Any]:
    """A live request's TTFT in parts (seconds), None when the servers'
    timing log does not have it: `to_server` (sent to the server's receipt:
    the request path and any wait in the EPP's queues), `in_server` (receipt
    to the first byte written; the whole answer when not streamed), `model`
    (the same in the server model's own time, without its handler's and
    event loop's), `back` (written to read by the client)."""

    def parts(request: LiveRequest) -> tuple[float, ...] | None:
        served = run.served.get(request.request_id)
        if served is None or served.model_first is None or served.model_done is None:
            return None
        stream = streamed[request.tenant]
        written, model = (
            (served.first, served.model_first) if stream else (served.done, served.model_done)
        )
        sent = run.origin + live_sent(request)
        read = run.origin + live_first_byte(request)
        return served.received - sent, written - served.received, model, read - written

    return parts


def sim_parts(scenario: Scenario) -> Callable[[SimRequest], Any]:
    """`live_parts` of a simulated request: the server is the model, so
    `in_server` and `model` are one."""
    first_byte = sim_first_byte(scenario)

    def parts(request: SimRequest) -> tuple[float, ...] | None:
        if request.delivered_at is None:
            return None
        back = request.response_delay or 0.0
        in_server = first_byte(request) - back - request.delivered_at
        return request.delivered_at - request.arrival, in_server, in_server, back

    return parts


def ttft_parts(requests: Sequence[Any], parts: Callable[[Any], Any]) -> dict[str, Any] | None:
    """Per part (`PARTS`), p50 and p90 in milliseconds over the completed requests."""
    found = [p for r in requests if r.outcome == COMPLETED and (p := parts(r)) is not None]
    if not found:
        return None
    values = 1000 * np.asarray(found)
    return {
        name: [float(q) for q in np.percentile(values[:, index], (50, 90))]
        for index, name in enumerate(PARTS)
    }


def members_of(scenario: Scenario, objective: str) -> set[int]:
    return {i for i, t in enumerate(scenario.tenants) if t.objective == objective}


def compare(
    scenario: Scenario,
    run: LiveRun,
    sims: list[list[SimRequest]],
    single: list[SimRequest],
) -> dict[str, Any]:
    objectives: dict[str, Any] = {}
    first_byte = sim_first_byte(scenario)
    live_split = live_parts(run, [t.stream for t in scenario.tenants])
    sim_split = sim_parts(scenario)
    for objective in scenario.objectives:
        members = members_of(scenario, objective.name)
        if not members:
            continue
        mine = [r for r in run.requests if r.tenant in members]
        live_side = side_stats(mine, live_first_byte, live_sent)
        live_side["ttft_parts_ms"] = ttft_parts(mine, live_split)
        pooled = [r for sim in sims for r in sim if r.tenant in members]
        sim_side = side_stats(pooled, first_byte, sim_sent, len(sims))
        sim_side["ttft_parts_ms"] = ttft_parts(pooled, sim_split)
        singles = [
            side_stats([r for r in sim if r.tenant in members], first_byte, sim_sent)
            for sim in sims
        ]
        for quantile in ("p50", "p90"):
            values = [s[f"ttft_{quantile}_s"] for s in singles if s[f"ttft_{quantile}_s"]]
            sim_side[f"ttft_{quantile}_range_s"] = [min(values), max(values)] if values else None
        plain = side_stats([r for r in single if r.tenant in members], first_byte, sim_sent)
        plain_keys = ("completed", "rejected", "ttft_p50_s", "ttft_p90_s")
        objectives[objective.name] = {
            "sim": sim_side,
            "live": live_side,
            "sim_single": {k: plain[k] for k in plain_keys},
            "ttft_p50_ratio": ratio(live_side["ttft_p50_s"], sim_side["ttft_p50_s"]),
            "ttft_p90_ratio": ratio(live_side["ttft_p90_s"], sim_side["ttft_p90_s"]),
            "completed_ratio": ratio(live_side["completed"], sim_side["completed"]),
            "rejected_ratio": ratio(live_side["rejected"], sim_side["rejected"]),
        }
    return objectives


def met(objectives: dict[str, Any]) -> bool:
    return all(
        within(o["ttft_p50_ratio"], TTFT_TARGET)
        and within(o["ttft_p90_ratio"], TTFT_TARGET)
        and within(o["completed_ratio"], COMPLETED_TARGET)
        for o in objectives.values()
    )


def milliseconds(values: Sequence[float]) -> dict[str, float]:
    p50, p99 = np.percentile(np.asarray(values), (50, 99))
    return {"p50": 1000 * float(p50), "p99": 1000 * float(p99), "max": 1000 * max(values)}


def with_live_path(scenario: Scenario, path_ms: dict[str, Any], warnings: list[str]) -> Scenario:
    """`scenario` with the path the live run measured (`to_model`,
    `from_model`: p50 and p90) in place of `pool.path_ms`; as it was, with a
    warning, for a leg the run did not measure."""
    legs = {}
    for leg, measured in (("request_path", "to_model"), ("response_path", "from_model")):
        q = path_ms.get(measured)
        if q is None:
            warnings.append(f"--path live: the run measured no {measured}; the scenario's stays")
            continue
        legs[leg] = PathDelay(q["p50"], max(q["p50"], q["p90"]))
    return dataclasses.replace(scenario, pool=dataclasses.replace(scenario.pool, **legs))


def measure(path: str, duration_s: float, sim_runs: int, live_path: bool = False) -> dict[str, Any]:
    scenario, warnings = comparable(load_scenario(path), duration_s)
    arrivals = workload(scenario)
    load_before = os.getloadavg()
    run = play_live(scenario, arrivals)
    live = run.requests
    load_after = os.getloadavg()
    lateness = [r.sent_at - r.arrival for r in live if r.sent_at is not None]
    late_ms = milliseconds(lateness) if lateness else None
    if late_ms is not None and late_ms["p99"] > STARVED_LATE_MS:
        warnings.append(
            f"load generator late by {late_ms['p99']:.0f} ms at p99: the machine was short "
            "of CPU, so the live side measured the machine too"
        )
    if live_path:
        scenario = with_live_path(scenario, run.path_ms, warnings)
    started = time.perf_counter()
    single = simulate(scenario, arrivals, "epp").requests
    sims = [
        simulate(scenario, late_arrivals(arrivals, lateness or [0.0], seed), "epp").requests
        for seed in range(1, sim_runs + 1)
    ]
    sim_wall = time.perf_counter() - started
    objectives = compare(scenario, run, sims, single)
    warnings.extend(
        f"{name}: {o['live']['completed']:.0f} completed live, too few for its TTFT "
        "quantiles to say much"
        for name, o in objectives.items()
        if o["live"]["completed"] < FEW_COMPLETED
    )
    return {
        "objectives": objectives,
        "met": met(objectives),
        "targets": {"ttft_ratio": TTFT_TARGET, "completed_ratio": COMPLETED_TARGET},
        "scenario": {
            "name": scenario.name,
            "path": str(path),
            "seed": scenario.seed,
            "duration_s": duration_s,
            "requests": len(arrivals),
            "servers": scenario.pool.servers,
            "path_ms": {
                leg: [delay.median_ms, delay.p90_ms]
                for leg, delay in (
                    ("request", scenario.pool.request_path),
                    ("response", scenario.pool.response_path),
                )
            },
        },
        "sim_runs": sim_runs,
        "live": {
            "wall_s": run.wall_s,
            "loadgen_late_ms": late_ms,
            "path_ms": run.path_ms,
            "errors": sum(1 for r in live if (r.outcome or "").startswith("error")),
        },
        "sim_wall_s": sim_wall,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
        },
        "warnings": warnings,
    }


def render(result: dict[str, Any]) -> str:
    info = result["scenario"]
    lines = [
        f"{info['name']}: {info['duration_s']:g} s, {info['requests']} requests, "
        f"{info['servers']} servers; sim = {result['sim_runs']} runs pooled",
        f"{'objective':10s} {'p50 sim':>8s} {'live':>6s} {'ratio':>6s}  "
        f"{'p90 sim':>8s} {'live':>6s} {'ratio':>6s}  {'done sim':>8s} {'live':>5s} {'ratio':>6s}",
    ]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{1000 * value:.0f}"

    def r(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for name, o in result["objectives"].items():
        sim, live = o["sim"], o["live"]
        lines.append(
            f"{name:10s} {ms(sim['ttft_p50_s']):>8s} {ms(live['ttft_p50_s']):>6s} "
            f"{r(o['ttft_p50_ratio']):>6s}  {ms(sim['ttft_p90_s']):>8s} "
            f"{ms(live['ttft_p90_s']):>6s} {r(o['ttft_p90_ratio']):>6s}  "
            f"{sim['completed']:8.1f} {live['completed']:5.0f} {r(o['completed_ratio']):>6s}"
        )
    for name, o in result["objectives"].items():
        live_parts_ms, sim_parts_ms = o["live"]["ttft_parts_ms"], o["sim"]["ttft_parts_ms"]
        if live_parts_ms and sim_parts_ms:
            lines.append(
                f"{name:10s} TTFT p50 in parts, live / sim ms: "
                + ", ".join(
                    f"{part} {live_parts_ms[part][0]:.0f} / {sim_parts_ms[part][0]:.0f}"
                    for part in PARTS
                )
            )
    late = result["live"]["loadgen_late_ms"]
    if late:
        lines.append(
            f"load generator late: p50 {late['p50']:.1f} ms, p99 {late['p99']:.1f} ms, "
            f"max {late['max']:.1f} ms; load average {result['machine']['load_average']} "
            f"on {result['machine']['cpus']} cpus"
        )
    path = result["live"].get("path_ms") or {}
    for leg in ("request", "response"):
        q = path.get(leg)
        if q:
            median, p90 = result["scenario"]["path_ms"][leg]
            lines.append(
                f"{leg} path live: p50 {q['p50']:.1f} ms, p90 {q['p90']:.1f} ms (n={q['n']}); "
                f"simulated: median {median:g}, p90 {p90:g}"
            )
    lines.append(f"targets met: {result['met']}")
    lines.extend(f"warning: {w}" for w in result["warnings"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO))
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        metavar="S",
        help=f"seconds of the scenario's load to play (default {DEFAULT_DURATION_S:g})",
    )
    parser.add_argument(
        "--sim-runs",
        type=int,
        default=DEFAULT_SIM_RUNS,
        metavar="N",
        help=f"simulated runs pooled on the sim side (default {DEFAULT_SIM_RUNS})",
    )
    parser.add_argument(
        "--path",
        choices=("scenario", "live"),
        default="scenario",
        help="the simulated gateway path: the scenario's `pool.path_ms` (default), or what "
        "the live run measured (its to_model and from_model p50 and p90), which takes the "
        "machine's load out of the comparison",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not args.duration > 0 or args.sim_runs < 1:
        parser.error("--duration must be positive and --sim-runs at least 1")
    try:
        result = measure(args.scenario, args.duration, args.sim_runs, args.path == "live")
    except ScenarioError as error:
        print(f"bench.sim_vs_live: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
