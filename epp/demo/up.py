"""`epp up`: a local stack to keep running: simulated model servers, `epp serve`
and Envoy on loopback, up until Ctrl-C (or SIGTERM).

The pool, the objectives and the EPP configuration come from a scenario
(default config/scenarios/demo.yaml, as `epp demo`), but no load is played:
point a client, a dashboard or a benchmark at the gateway URL it prints,
with the `curl` and OpenAI-SDK lines it prints. On the signal everything it
started is stopped, in reverse order (`epp.demo.stack`), and it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys
import time

from epp.cli import given, positive
from epp.demo.command import add_stack_arguments, live_scenario
from epp.demo.envoy_config import LISTEN_PORT
from epp.sim.scenario import Scenario

METRICS_PORT = 9090
CRASH_CHECK_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_stack_arguments(
        parser,
        "scenario whose pool, objectives and EPP configuration to run "
        "(default: config/scenarios/demo.yaml); its load is not played",
    )
    parser.add_argument(
        "--servers", type=positive(int), metavar="N", help="model servers (default: the scenario's)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=LISTEN_PORT,
        help=f"Envoy's port for clients (default {LISTEN_PORT}; 0: a free one)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=METRICS_PORT,
        help=f"the EPP's /metrics port (default {METRICS_PORT}; 0: a free one)",
    )


def snippets(gateway: str, model: str, objective: str | None) -> str:
    """Ready-to-paste requests through the gateway."""
    header = f" -H 'x-llm-d-inference-objective: {objective}'" if objective else ""
    sdk_header = (
        f', default_headers={{"x-llm-d-inference-objective": "{objective}"}}' if objective else ""
    )
    return (
        "try it:\n"
        f"  curl -s {gateway}/v1/chat/completions -H 'content-type: application/json'{header} \\\n"
        f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", '
        f'"content": "Hello"}}], "max_tokens": 32}}\'\n'
        "OpenAI SDK (pip install openai):\n"
        "  from openai import OpenAI\n"
        f'  client = OpenAI(base_url="{gateway}/v1", api_key="unused"{sdk_header})\n'
        f'  reply = client.chat.completions.create(model="{model}", max_tokens=32,\n'
        '      messages=[{"role": "user", "content": "Hello"}])\n'
        "  print(reply.choices[0].message.content)"
    )


async def keep_up(scenario: Scenario, engine: str, args: argparse.Namespace, say=print) -> int:
    """Start the stack, say where it is, wait for the signal, stop it."""
    from epp.demo.demo import describe, stack_settings
    from epp.demo.processes import log_tail
    from epp.demo.stack import live_stack

    settings = dataclasses.replace(
        stack_settings(scenario, engine),
        servers=args.servers or scenario.pool.servers,
        envoy_listen_port=args.port,
        epp_metrics_port=args.metrics_port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    started = time.monotonic()
    crashed = False
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        gateway = stack.envoy.url
        objective = scenario.objectives[0].name if scenario.objectives else None
        say(describe(stack))
        say(f"gateway: {gateway}")
        say(f"metrics: {stack.epp_metrics_url}")
        say(snippets(gateway, scenario.model, objective))
        say(f"up in {time.monotonic() - started:.1f} s; Ctrl-C stops everything")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), CRASH_CHECK_S)
            if stack.epp_crashed():
                assert stack.epp is not None
                crashed = True
                say(f"epp up: the EPP exited; its log:\n{log_tail(stack.epp.log_path)}")
                break
    say("epp up: stopped everything it started")
    return 1 if crashed else 0


def run(args: argparse.Namespace) -> int:
    from epp.demo.processes import PartFailed

    scenario = given(live_scenario, args.scenario)
    try:
        return asyncio.run(
            keep_up(scenario, args.engine, args, say=lambda text: print(text, flush=True))
        )
    except PartFailed as error:
        print(f"epp up: {error.part} failed to start: {error.reason}", file=sys.stderr)
        if error.part == "envoy" and args.port:
            print(f"epp up: is port {args.port} taken? --port picks another", file=sys.stderr)
        print("epp up: everything started was stopped", file=sys.stderr)
        return 1
