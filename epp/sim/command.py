"""`epp simulate SCENARIO.yaml [--json OUT] [--plots DIR]`: run a scenario
with ours and the baselines, print the report, optionally write it as JSON
and draw its plots."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from epp.cli import given
from epp.sim.report import build_report, render_text
from epp.sim.runner import Progress, run_scenario
from epp.sim.scenario_file import load_scenario

PROGRESS_AFTER_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--json", metavar="OUT", help="write the whole report as JSON to OUT")
    parser.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")


class ProgressBars:
    """One bar per run on `stream`, in virtual seconds; shown only once the
    whole simulation has taken longer than a second of wall-clock time."""

    def __init__(self, total_s: float, stream: TextIO) -> None:
        self.total_s = total_s
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, label: str) -> Progress:
        bar: tqdm | None = None

        def update(virtual_s: float) -> None:
            nonlocal bar
            if bar is None:
                if time.monotonic() - self.started < PROGRESS_AFTER_S:
                    return
                bar = tqdm(
                    total=round(self.total_s), desc=label, unit="s", file=self.stream, leave=False
                )
            bar.update(max(0, min(round(virtual_s), bar.total) - bar.n))
            if virtual_s >= self.total_s:
                bar.close()

        return update


def run(args: argparse.Namespace) -> int:
    scenario = given(load_scenario, args.scenario)
    # bars redraw with carriage returns: on a terminal only, not in a file or a pipe
    bars = ProgressBars(scenario.duration_s, sys.stderr) if sys.stderr.isatty() else None
    result = run_scenario(scenario, bars)
    report = build_report(result)
    print(render_text(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.plots:
        from epp.sim.plots import write_plots

        for path in write_plots(result, Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr)
    return 0
