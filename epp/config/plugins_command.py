"""`epp plugins [--json]`: list every plugin type of the registry: kind,
whether epp runs it (and if not, why), what it does and its parameters."""

from __future__ import annotations

import argparse
import json
import sys

from epp.config.registry import REGISTRY, describe


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
        line = f"{mark}{entry.name:<{width}}  {entry.kind.value:<19}  {entry.summary}"
        if reason is not None:
            line += f"  [not supported: {reason}]"
        print(line)
        for param in entry.parameters:
            default = "" if param.default in (None, "", ()) else f" = {param.default!r}"
            print(f"      {param.name}: {param.type.value}{default}")
    supported = sum(entry.supported for entry in REGISTRY)
    print(f"{len(REGISTRY)} plugin types, {supported} supported ('-' marks the others)")
    return 0
