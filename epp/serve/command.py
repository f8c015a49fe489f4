"""`epp serve`: run the EPP (ext_proc for Envoy, gRPC health, Prometheus metrics).

The flags are the fields of `epp.serve.options.ServeOptions` (one table:
parser, help and options object); see epp.serve.server for how the inputs are
chosen. epp.serve.server (gRPC, aiohttp, prometheus-client) is imported in
`run`, not at the top, so that `--help` and the other subcommands start light.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
from collections.abc import Callable

from epp.serve import logs
from epp.serve.options import ServeOptions, add_arguments, given_options

__all__ = ["add_arguments", "loop_factory", "run", "settle_heap"]

log = logging.getLogger("epp.serve.server")


def run(args: argparse.Namespace) -> int:
    given = given_options(args)
    options = ServeOptions(**given)
    logs.configure(options)
    problems = options.problems()
    for problem in problems:
        log.error("cannot start: %s", problem)
    if problems:
        return 2
    for warning in options.inert_warnings(given):
        log.warning("%s", warning)
    from epp.serve.server import serve

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(serve(options))


GC_GEN0_THRESHOLD = 50_000
"""Allocations between young-generation collections once started (default
700): the hot path allocates many short-lived objects and few cycles."""


def settle_heap() -> None:
    """Once a process of `epp serve` (the EPP, the core owner, a protocol
    worker) is built and about to serve: what start-up allocated is frozen
    out of the collector's passes, and young collections come less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (a faster loop for the hot path),
    else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
