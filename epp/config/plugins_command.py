"""`epp plugins [--json]`: list every plugin type of the registry: kind,
stability (the reference's alpha or beta: alpha types need
`--allow-experimental-plugins`), whether epp runs it (and if not, why), what
it does and its parameters with their defaults written as a configuration
writes them (durations as Go durations, "200ms")."""

from __future__ import annotations

import argparse
import json
import sys

from epp.config.plugin import Stability
from epp.config.registry import REGISTRY, describe, written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document instead of text")


def run(args: argparse.Namespace) -> int:
    if args.json:
        json.dump([describe(entry) for entry in REGISTRY], sys.stdout, indent=2)
        print()
        return 0
    width = max(len(entry.name) for entry in REGISTRY)
    for entry in REGISTRY:
        reason = entry.reason
        mark = "  " if reason is None else "- "
        line = (
            f"{mark}{entry.name:<{width}}  {entry.kind.value:<19}  "
            f"{entry.stability.value:<5}  {entry.summary}"
        )
        if reason is not None:
            line += f"  [not supported: {reason}]"
        print(line)
        for param in entry.parameters:
            default = (
                ""
                if param.default in (None, "", ())
                else f" = {_yaml(written(param.default, param.type))}"
            )
            print(f"      {param.name}: {param.type.value}{default}")
    supported = sum(entry.supported for entry in REGISTRY)
    alpha = sum(entry.stability is Stability.ALPHA for entry in REGISTRY)
    print(
        f"{len(REGISTRY)} plugin types, {supported} supported ('-' marks the others), "
        f"{alpha} alpha (they need --allow-experimental-plugins)"
    )
    return 0


def _yaml(value: object) -> str:
    """A default as it is written in the configuration's YAML."""
    return value if isinstance(value, str) and value.strip() == value else json.dumps(value)
