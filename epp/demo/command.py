"""`epp demo`: the EPP live on this machine, behind a real Envoy, with simulated model servers.

Starts simulated vLLM servers, `epp serve` and Envoy on loopback, plays the
scenario's load through Envoy in real time, prints the per-tier table of
`epp simulate`, and stops everything it started (also on Ctrl-C, or when a
part fails to start).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from epp.cli import given, positive
from epp.demo.server_metrics import ENGINES
from epp.sim.scenario import Scenario
from epp.sim.scenario_file import ScenarioError, load_scenario

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "config" / "scenarios" / "demo.yaml"


def add_stack_arguments(parser: argparse.ArgumentParser, scenario_help: str) -> None:
    """The scenario and the engine pose of a live stack (`epp demo`, `epp up`)."""
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO), help=scenario_help)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="the engine the simulated model servers pose as (default vllm)",
    )


def live_scenario(path: str) -> Scenario:
    """The scenario at `path`, if a live stack can run it (ScenarioError otherwise)."""
    scenario = load_scenario(path)
    if len(scenario.pool.groups) > 1:
        raise ScenarioError(
            [
                "pool: a pool of several server groups runs only in the simulator "
                "(epp simulate); the live stack's servers are all alike"
            ],
            path,
        )
    return scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_stack_arguments(
        parser, "scenario file (default: config/scenarios/demo.yaml, ~30 s of overload)"
    )
    parser.add_argument(
        "--duration",
        type=positive(float),
        metavar="S",
        help="play this many seconds of the scenario",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="play the scenario once per policy (its configuration, each variant with a "
        "configuration file, round-robin if a baseline) and print hit rate and TTFT side by side",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from epp.demo.compare import render_compare, run_compare
    from epp.demo.demo import run_demo
    from epp.demo.processes import PartFailed
    from epp.demo.report import render_live_text

    scenario = given(live_scenario, args.scenario)
    if args.duration is not None:
        scenario = dataclasses.replace(scenario, duration_s=args.duration)
    if scenario.events:
        print("epp demo: note: server events are not played live", file=sys.stderr)
    try:
        if args.compare:
            report = asyncio.run(run_compare(scenario, engine=args.engine))
            text, crashed = render_compare(report), False
        else:
            result = asyncio.run(run_demo(scenario, engine=args.engine))
            report, crashed = result.report, result.epp_crashed
            text = render_live_text(report)
    except PartFailed as error:
        print(f"epp demo: {error.part} failed to start: {error.reason}", file=sys.stderr)
        print("epp demo: everything started was stopped", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nepp demo: interrupted; everything started was stopped", file=sys.stderr)
        return 130
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    if crashed:
        print("epp demo: the EPP exited during the run", file=sys.stderr)
        return 1
    return 0
