"""Simulated model servers in one process: `python -m epp.demo.model_server`'s
command line (`main`: `--count` servers on free loopback ports, the ports
written to `--ready-file` once they listen, stopped by SIGTERM), and
`serving_on`, the same for a block of code in a test or a bench.

One server, its HTTP surface and its timing are `epp.demo.model_server`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from pathlib import Path

from epp.demo.kv_publisher import KVEventsPublishing
from epp.demo.model_server import SimulatedServer
from epp.demo.processes import serve_until_signalled
from epp.demo.server_metrics import ENGINES
from epp.demo.tokenizer_file import encoder
from epp.sim.scenario import KvTransfer
from epp.sim.server_model import ServerParams


@contextlib.asynccontextmanager
async def serving_on(
    servers: Sequence[SimulatedServer], hosts: Sequence[str]
) -> AsyncIterator[list[SimulatedServer]]:
    """`servers[i]` listening on `hosts[i]` (a free port) for the block; the
    ones started are stopped after it, also when a later one fails to start."""
    started: list[SimulatedServer] = []
    try:
        for server, host in zip(servers, hosts, strict=True):
            await server.start(host)
            started.append(server)
        yield started
    finally:
        for server in started:
            await server.stop()


async def _serve(
    count: int,
    params: ServerParams,
    model_name: str,
    ready_file: str,
    kv_transfer: KvTransfer,
    engine: str,
    timing_log: str | None,
    tokenizer_dir: str | None = None,
    hosts: Sequence[str] = (),
    kv_events_port: int = 0,
) -> None:
    tokenizer = encoder(Path(tokenizer_dir)) if tokenizer_dir else None
    publishing = KVEventsPublishing(kv_events_port, None) if kv_events_port else None
    with contextlib.ExitStack() as stack:
        timing = stack.enter_context(open(timing_log, "a", buffering=1)) if timing_log else None
        servers = [
            SimulatedServer(
                params,
                model_name,
                kv_transfer,
                engine=engine,
                timing=timing,
                tokenizer=tokenizer,
                kv_events=publishing,
                host=hosts[index] if hosts else "127.0.0.1",
            )
            for index in range(count)
        ]
        await serve_until_signalled(servers, ready_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp.demo.model_server")
    parser.add_argument("--count", type=int, default=1, help="servers to run (default 1)")
    parser.add_argument(
        "--params",
        default="{}",
        help=f"JSON object of ServerParams fields; defaults: {json.dumps(asdict(ServerParams()))}",
    )
    parser.add_argument("--model", default="model", help="the model name /v1/models lists")
    parser.add_argument(
        "--kv-transfer",
        default="{}",
        help="JSON object of KvTransfer fields (a remote prefill's KV pull); "
        f"defaults: {json.dumps(asdict(KvTransfer()))}",
    )
    parser.add_argument("--ready-file", required=True, help="where to write the bound ports")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="the engine whose metrics the servers show (default vllm)",
    )
    parser.add_argument(
        "--timing-log",
        help="append each answered request's times to this file, one JSON line "
        "(x-request-id; received, first token written, done; time.monotonic() seconds)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="tokenize with DIR/tokenizer.json (epp.demo.tokenizer_file) instead of "
        "the simulated tokenizer",
    )
    parser.add_argument(
        "--hosts",
        default="",
        help="comma-separated loopback addresses, one per server (default: all on 127.0.0.1)",
    )
    parser.add_argument(
        "--kv-events-port",
        type=int,
        default=0,
        help="publish each server's KV-cache events on its host at this port (0: none)",
    )
    args = parser.parse_args(argv)
    hosts = tuple(host for host in args.hosts.split(",") if host)
    if hosts and len(hosts) != args.count:
        parser.error(f"--hosts: {len(hosts)} addresses for {args.count} servers")
    try:
        params = ServerParams(**json.loads(args.params))
    except (TypeError, ValueError) as error:
        parser.error(f"--params: {error}")
    try:
        kv_transfer = KvTransfer(**json.loads(args.kv_transfer))
    except (TypeError, ValueError) as error:
        parser.error(f"--kv-transfer: {error}")
    asyncio.run(
        _serve(
            args.count,
            params,
            args.model,
            args.ready_file,
            kv_transfer,
            args.engine,
            args.timing_log,
            args.tokenizer,
            hosts,
            args.kv_events_port,
        )
    )
    return 0
