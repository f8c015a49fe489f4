"""The pause reproduction of a lost wakeup (bench/README.md, the
extproc_e2e stall): a closed loop of 32 through Envoy + `epp serve` to one
fast stand-in model server (config/envoy/direct.yaml), the stand-in paused
(SIGSTOP) for `--pause` seconds every `--every` seconds.

    python -m bench.stall [--workers N] [--runs 4] [--seconds 36]

The stand-in reads idle at almost every scrape, so the adaptive gate's
pending budget is freed by the reads' times alone: a read of unchanged
values that does not reach the core leaves the closed loop's requests
queued with nothing in flight. Each second's completions are counted; a
second under `--floor` (150) requests after the first three is a stall
second. The pause blocks this process's loop too (as the first
reproduction did), so no request is sent while the stand-in is stopped.
A wait shorter than a second shows in the latencies instead: those of the
requests sent after the warm-up that did not overlap a pause.

Prints one JSON object per run: completions per second, stall seconds,
their stretches, the lowest second after the warm-up, and of those
latencies the median, p99, largest and how many took over 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time

import aiohttp

from bench.extproc_e2e import BODY, url_of
from epp.demo.envoy_process import CONFIG_DIR, running_envoy
from tests.support.epp_process import running_epp

WARM_UP_S = 3


async def one_run(args: argparse.Namespace) -> dict:
    async with contextlib.AsyncExitStack() as stack:
        model_server = await stack.enter_async_context(
            running_envoy(epp_port=0, template=CONFIG_DIR / "direct.yaml")
        )
        flags = [f"--endpoints=127.0.0.1:{model_server.listen_port}", "--log-level=warning"]
        if args.workers:
            flags.append(f"--workers={args.workers}")
        epp = await stack.enter_async_context(running_epp(*flags))
        gateway = await stack.enter_async_context(running_envoy(epp_port=epp.ports["grpc"]))
        url = url_of(gateway)
        done = 0
        stop = False
        loop = asyncio.get_running_loop()
        spans: list[tuple[float, float]] = []
        pauses: list[tuple[float, float]] = []
        headers = {"content-type": "application/json"}
        connector = aiohttp.TCPConnector(limit=args.concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def client() -> None:
                nonlocal done
                while not stop:
                    sent = loop.time()
                    async with session.post(url, data=BODY, headers=headers) as response:
                        await response.read()
                    spans.append((sent, loop.time()))
                    done += 1

            clients = [asyncio.create_task(client()) for _ in range(args.concurrency)]
            per_second = []
            last = 0
            warm = loop.time() + WARM_UP_S
            for second in range(args.seconds):
                await asyncio.sleep(1)
                per_second.append(done - last)
                last = done
                if second % args.every == args.every // 2:
                    paused = loop.time()
                    os.kill(model_server.process.pid, signal.SIGSTOP)
                    time.sleep(args.pause)
                    os.kill(model_server.process.pid, signal.SIGCONT)
                    pauses.append((paused, loop.time()))
            stop = True
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
    measured = per_second[WARM_UP_S:]
    stalled = [n < args.floor for n in measured]
    stretches = sum(1 for i, s in enumerate(stalled) if s and (i == 0 or not stalled[i - 1]))
    latencies = sorted(
        end - sent
        for sent, end in spans
        if sent >= warm and not any(sent < until and end > start for start, until in pauses)
    )
    return {
        "workers": args.workers,
        "per_second": per_second,
        "stall_seconds": sum(stalled),
        "stretches": stretches,
        "lowest": min(measured),
        "latency_ms": {
            "p50": round(latencies[len(latencies) // 2] * 1e3, 1),
            "p99": round(latencies[int(len(latencies) * 0.99)] * 1e3, 1),
            "max": round(latencies[-1] * 1e3, 1),
            "over_100": sum(1 for latency in latencies if latency > 0.1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="--workers (0: one process)")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=36)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--floor", type=int, default=150)
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps(asyncio.run(one_run(args))), flush=True)


if __name__ == "__main__":
    main()
