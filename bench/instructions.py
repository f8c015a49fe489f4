"""Instructions per simulated request: `python -m bench.instructions [N] [--policy P] [--tree D]`.

Wall time on a shared machine moves by 20-30% between identical runs; the
instruction count of a deterministic simulation does not. This runs
`bench.simulator`'s scenario for N requests (default 10,000) under
`valgrind --tool=cachegrind --cache-sim=no`, twice: once stopped just before
the simulation (imports, scenario, workload), once through the simulation
of policy P (default `epp`), and prints the difference divided by the requests simulated (about N).

`--tree DIR` measures the code in another checkout (e.g. a worktree of an
old commit): DIR goes first on PYTHONPATH. The simulation itself is
`bench.simulator.scenario_document`, as this tree has it, for both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, json
sys.path.insert(0, {tree!r})
from epp.sim.runner import simulate
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload
scenario = parse_scenario(json.loads({document!r}))
arrivals = workload(scenario)
print(len(arrivals))
if {run!r}:
    simulate(scenario, arrivals, {policy!r})
"""

TOTAL = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(tree: str, document: dict, policy: str, run: bool) -> tuple[int, int]:
    """Instructions of one child process (cachegrind's `I refs`), and the
    number of requests it simulated or would have."""
    code = CHILD.format(tree=tree, document=json.dumps(document), policy=policy, run=run)
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={scratch}/out",
                sys.executable,
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"},
            check=True,
        )
    found = TOTAL.search(result.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{result.stderr}")
    return int(found.group(1).replace(",", "")), int(result.stdout)


def main() -> None:
    from bench.simulator import scenario_document

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests", type=int, nargs="?", default=10_000)
    parser.add_argument("--policy", default="epp", help="epp, round-robin, least-queue")
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args()
    document = scenario_document(args.requests)
    tree = str(Path(args.tree).resolve())
    # The stopped run first: it writes any bytecode caches the edited code needs.
    setup, _ = instructions(tree, document, args.policy, False)
    whole, requests = instructions(tree, document, args.policy, True)
    print(
        json.dumps(
            {
                "tree": tree,
                "policy": args.policy,
                "requests": requests,
                "instructions_per_request": round((whole - setup) / requests),
            }
        )
    )


if __name__ == "__main__":
    main()
