"""Instructions per simulated request: `python -m bench.instructions [N] [--policy P] [--path W]`.

Wall time on a shared machine moves by 20-30% between identical runs; the
instruction count of a deterministic simulation does not. This runs
`bench.simulator`'s scenario for N requests (default 10,000) under
`valgrind --tool=cachegrind --cache-sim=no`, twice: once stopped just before
the simulation (imports, scenario, workload), once through the simulation
of policy P (default `epp`), and prints the difference divided by the
requests simulated (about N). Each child collects its garbage (the
simulation's objects hold each other: only the collector frees them) and
ends with `os._exit`, skipping the interpreter's finalization, whose module
teardown and last collection moved the figure by up to 8,000 a request
between trees a few slots apart (bench/README.md, session 17).

It does so twice (`--path both`, the default): with the simulated gateway
path off (`pool.path_ms: 0`, the servers talk to the EPP directly:
`path_off`, the figure to compare with a tree older than the path, such as
issue 24's `1ccf12c`) and on as a scenario has it by default (`path_on`,
what a default scenario costs). `--path off` or `--path on` runs one.

`--tree DIR` measures the code in another checkout (e.g. a worktree of an
old commit): DIR goes first on PYTHONPATH. The simulation itself is
`bench.simulator.scenario_document`, as this tree has it, for both. A tree
without the gateway path (it rejects `path_ms`) has only `path_off`, and
`path_on` is null.
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
import sys, json, os
sys.path.insert(0, {tree!r})
from epp.sim.runner import simulate
try:
    from epp.sim.scenario_file import parse_scenario
except ImportError:  # a tree from before scenario.py's split
    from epp.sim.scenario import parse_scenario
from epp.sim.workload import workload
document = json.loads({document!r})
if {path!r} == "off":
    document["pool"]["path_ms"] = 0
try:
    scenario = parse_scenario(document)
except Exception as error:  # a tree without the gateway path: off is all it has
    if {path!r} != "off" or "path_ms" not in str(error):
        raise
    del document["pool"]["path_ms"]
    scenario = parse_scenario(document)
if {path!r} == "on" and not hasattr(scenario.pool, "request_path"):
    print("no-path")
    raise SystemExit
arrivals = workload(scenario)
print(len(arrivals), flush=True)
if {run!r}:
    simulate(scenario, arrivals, {policy!r})
import gc
gc.collect()
os._exit(0)
"""

TOTAL = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(
    tree: str, document: dict, policy: str, path: str, run: bool
) -> tuple[int, int] | None:
    """Instructions of one child process (cachegrind's `I refs`), and the
    number of requests it simulated or would have; None for the path on in
    a tree that has none."""
    code = CHILD.format(tree=tree, document=json.dumps(document), policy=policy, path=path, run=run)
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
    if result.stdout.strip() == "no-path":
        return None
    found = TOTAL.search(result.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{result.stderr}")
    return int(found.group(1).replace(",", "")), int(result.stdout)


def per_request(tree: str, document: dict, policy: str, path: str) -> tuple[int, int] | None:
    """Instructions per simulated request of the simulation alone, and the
    requests simulated."""
    # The stopped run first: it writes any bytecode caches the edited code needs.
    setup = instructions(tree, document, policy, path, False)
    if setup is None:
        return None
    whole = instructions(tree, document, policy, path, True)
    assert whole is not None
    return round((whole[0] - setup[0]) / whole[1]), whole[1]


def main() -> None:
    from bench.simulator import scenario_document

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests", type=int, nargs="?", default=10_000)
    parser.add_argument("--policy", default="epp", help="epp, round-robin, least-queue")
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument(
        "--path",
        choices=("both", "off", "on"),
        default="both",
        help="the simulated gateway path: off (like for like with trees older than it), "
        "on (a default scenario), or both (default)",
    )
    args = parser.parse_args()
    document = scenario_document(args.requests)
    tree = str(Path(args.tree).resolve())
    result: dict = {"tree": tree, "policy": args.policy, "requests": None}
    for path in ("off", "on"):
        if args.path in ("both", path):
            measured = per_request(tree, document, args.policy, path)
            result[f"path_{path}"] = None if measured is None else measured[0]
            if measured is not None:
                result["requests"] = measured[1]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
