"""P/D against the same servers aggregated, across load:
`python -m bench.pd_sweep [SCENARIO] [--loads 0.5,1,1.5] [--json]`.

Runs a P/D scenario (default `config/scenarios/pd-long-prompts.yaml`) with
every tenant's rate scaled by each load factor, and reports per factor the
goodput (requests per second meeting both SLOs) of ours (P/D as the scenario
configures it) and of the `aggregated` baseline, their ratio, the share
disaggregated, and p90 TTFT and TPOT. The simulator is deterministic: the
same command gives the same numbers on any machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from epp.sim.report import build_report
from epp.sim.runner import run_scenario
from epp.sim.scenario_file import load_scenario

DEFAULT = Path(__file__).resolve().parents[1] / "config" / "scenarios" / "pd-long-prompts.yaml"


def sweep(path: Path, loads: list[float]) -> list[dict]:
    base = load_scenario(path)
    rows = []
    for load in loads:
        tenants = tuple(dataclasses.replace(t, rate_rps=t.rate_rps * load) for t in base.tenants)
        scenario = dataclasses.replace(
            base, tenants=tenants, baselines=("aggregated",), isolation=False
        )
        policies = build_report(run_scenario(scenario))["policies"]
        ours, aggregated = policies["epp"], policies["aggregated"]
        rows.append(
            {
                "load": load,
                "offered_rps": sum(t.rate_rps for t in tenants),
                "goodput_rps": ours["goodput_rps"],
                "aggregated_goodput_rps": aggregated["goodput_rps"],
                "ratio": ours["goodput_rps"] / aggregated["goodput_rps"]
                if aggregated["goodput_rps"]
                else None,
                "disaggregated_share": ours["disaggregated_share"],
                "ttft_p90_s": ours["ttft_p90_s"],
                "aggregated_ttft_p90_s": aggregated["ttft_p90_s"],
                "tpot_p90_s": ours["tpot_p90_s"],
                "aggregated_tpot_p90_s": aggregated["tpot_p90_s"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pd_sweep")
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT))
    parser.add_argument("--loads", default="0.5,0.667,0.833,1,1.167")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args(argv)
    rows = sweep(Path(args.scenario), [float(x) for x in args.loads.split(",")])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'load':>6}{'offered':>9}{'P/D good':>10}{'aggr good':>11}{'ratio':>7}"
        f"{'disagg':>8}{'ttft90':>8}{'aggr':>7}{'tpot90':>8}{'aggr':>7}"
    )
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(
            f"{r['load']:>6.3g}{r['offered_rps']:>9.2f}{r['goodput_rps']:>10.2f}"
            f"{r['aggregated_goodput_rps']:>11.2f}{ratio:>7}{r['disaggregated_share']:>8.0%}"
            f"{r['ttft_p90_s'] * 1000:>8.0f}{r['aggregated_ttft_p90_s'] * 1000:>7.0f}"
            f"{r['tpot_p90_s'] * 1000:>8.1f}{r['aggregated_tpot_p90_s'] * 1000:>7.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
