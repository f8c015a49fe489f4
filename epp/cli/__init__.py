"""The `epp` command: one subcommand per job, each in the module that does it.

A subcommand module provides `add_arguments(parser)` and `run(args) -> int`;
it is imported only when its subcommand runs, so `epp validate` does not pay
for gRPC or the simulator. A command refuses what it is given by raising
`UsageError` (`given` turns a reader's ValueError into one); flags are
checked by their argparse types (`positive`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import TypeVar

A = TypeVar("A")
T = TypeVar("T")

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("epp.config.validate_command", "validate manifests and configuration files"),
    "plugins": ("epp.config.plugins_command", "list the plugin types a configuration may use"),
    "simulate": ("epp.sim.command", "simulate a scenario with ours and the baselines"),
    "serve": ("epp.serve.command", "run the EPP: ext_proc for Envoy, health, metrics"),
    "demo": ("epp.demo.command", "run the EPP live behind Envoy with simulated model servers"),
    "up": (
        "epp.demo.up",
        "start simulated model servers, the EPP and Envoy, and keep them up until Ctrl-C",
    ),
    "envoy-config": (
        "epp.demo.envoy_config",
        "write config/envoy/envoy.yaml filled in for a local EPP or a pool's",
    ),
    "sidecar": (
        "epp.demo.sidecar",
        "run the P/D routing sidecar in front of a decode server (x-prefiller-host-port)",
    ),
}
"""name -> (module, one-line help)."""


class UsageError(Exception):
    """What a subcommand refuses to start with (a file it is given, a mix of
    arguments): `main` prints `epp COMMAND: message` and exits with status 2."""


def given(read: Callable[[A], T], argument: A) -> T:
    """`read(argument)`; its ValueError (a `ConfigError`, a `ScenarioError`,
    a bad address) is the command's `UsageError`."""
    try:
        return read(argument)
    except ValueError as error:
        raise UsageError(str(error)) from error


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: `kind(text)`, which must be above 0."""

    def parse(text: str) -> float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, _ = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UsageError as error:
        print(f"epp {args.command}: {error}", file=sys.stderr)
        return 2


def build_parser(
    chosen: str | None = None, every: bool = False
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `epp` parser and its subcommands' parsers; only the chosen one (or
    every one) gets its arguments, so a command imports only its own module."""
    parser = argparse.ArgumentParser(
        prog="epp", description="Endpoint Picker for LLM inference pools."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        commands[name] = command
        if every or name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(command)
            command.set_defaults(run=module.run)
    return parser, commands


if __name__ == "__main__":
    sys.exit(main())
