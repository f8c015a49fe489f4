"""What one read of a model server's metrics page costs the EPP, by engine.

`python3 -m bench.scrape [--reads N] [--json] [--against REF]` poses a simulated server as
each engine (vLLM, SGLang, trtllm-serve: `epp.demo.server_metrics`, with
histograms filled as after a few hundred requests), and measures the EPP's
CPU per read two ways:

- `parse_us`: `MetricsReader.read` alone over successive pages whose load
  values change between reads, as a busy server's do;
- `read_us`: whole reads of `MetricsScraper`'s own loop, on uvloop as
  `epp serve` runs it, over `--endpoints` endpoints each read every 50 ms
  (timers, HTTP GET on loopback, body, parse, store update), against pages
  served by a child process (one port per endpoint), so the server's CPU
  is not counted.

Both are process CPU time (`time.process_time`) divided by reads, the
median of `REPEATS` runs (`--seconds` each for `read_us`).
`owner_share_512`: what `read_us` implies for a pool of 512 endpoints read
every 50 ms (the reference's default interval), as a share of one core.

`--against REF`: the same for epp at git REF (from `git archive`, run from
a temporary directory with this file) and for this tree, alternately,
`--rounds` times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.engines import ENGINE_LABEL, EngineLookup
from epp.datalayer.reader import MetricsReader
from epp.datalayer.scraper import MetricsScraper
from epp.datalayer.store import EndpointStore
from epp.demo.server_metrics import ENGINES, MetricsPages
from epp.scheduling.endpoint import EndpointMetrics
from epp.sim.server_model import ServerParams

PAGES = 32
"""Distinct pages per engine, cycled through."""
REPEATS = 5
POOL, INTERVAL = 512, 0.05
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


def pages(engine: str, count: int = PAGES, seed: int = 1) -> list[bytes]:
    """`count` pages of one server in the pose of `engine`, each after a few
    more requests and with other load values than the one before."""
    rng = random.Random(seed)
    current = [EndpointMetrics(waiting=0, running=0, kv_usage=0.0)]
    server = MetricsPages(engine, "model", ServerParams(), lambda: current[0], lambda: True)
    texts = []
    itl = [0] * len(ITL_BOUNDS)
    itl_count, itl_sum = 0, 0.0
    for page in range(count):
        for _ in range(200 if page == 0 else 5):
            server.first_token(rng.expovariate(5.0))
            server.finished(rng.expovariate(0.5), rng.randrange(50, 2000), rng.randrange(1, 500))
            latency = rng.expovariate(30.0)
            itl_count += 1
            itl_sum += latency
            for index, bound in enumerate(ITL_BOUNDS):
                if latency <= bound:
                    itl[index] += 1
        current[0] = EndpointMetrics(
            block_size=16,
            num_gpu_blocks=8000,
            updated_at=0.0,
            waiting=rng.randrange(0, 20),
            running=rng.randrange(1, 64),
            kv_usage=rng.random(),
            itl_sum=itl_sum,
            itl_count=itl_count,
            itl_bounds=ITL_BOUNDS,
            itl_buckets=tuple(float(count) for count in itl),
        )
        texts.append(server.prometheus_text())
    return texts


def parse_us(engine: str, reads: int) -> float:
    texts = [text.decode() for text in pages(engine)]
    names = EngineLookup().names_for({ENGINE_LABEL: engine})
    results = []
    for _ in range(REPEATS):
        reader = MetricsReader()
        started = time.process_time()
        for index in range(reads):
            reader.read(texts[index % len(texts)], names, float(index))
        results.append((time.process_time() - started) / reads * 1e6)
    return statistics.median(results)


def serve_pages(engine: str, ports: list[int], ready, served=None, backlog: int = 128) -> None:  # type: ignore[no-untyped-def]
    """A process serving the engine's metrics pages on every port, a new page
    each read; `served` (a shared `multiprocessing.Value`), if given, counts
    the reads."""
    import uvloop
    from aiohttp import web

    texts = pages(engine)
    path = MetricsPages(engine, "m", ServerParams(), lambda: None, lambda: True).prometheus_path
    count = [0]

    async def metrics(_: web.Request) -> web.Response:
        count[0] += 1
        if served is not None:
            served.value = count[0]
        return web.Response(
            body=texts[count[0] % len(texts)],
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    app = web.Application()
    app.router.add_get(path, metrics)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for port in ports:
            await web.TCPSite(runner, "127.0.0.1", port, backlog=backlog).start()
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


def _free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


async def _reads(engine: str, ports: list[int], seconds: float) -> list[float]:
    """CPU per read of the scraper's own loop over one endpoint per port,
    each read every `INTERVAL`, measured over `seconds` at a time."""
    store = EndpointStore(
        [EndpointSpec(f"e{port}", f"127.0.0.1:{port}", {ENGINE_LABEL: engine}) for port in ports]
    )
    results = []
    async with MetricsScraper(store, interval=INTERVAL) as scraper:
        await asyncio.sleep(1.0)  # every endpoint connected and read
        for _ in range(REPEATS):
            before, failures = scraper.reads, scraper.failures
            started = time.process_time()
            await asyncio.sleep(seconds)
            results.append((time.process_time() - started) / (scraper.reads - before) * 1e6)
            assert scraper.failures == failures, scraper.failures_by_reason
    return results


def read_us(engine: str, endpoints: int, seconds: float) -> float:
    import uvloop

    ports = _free_ports(endpoints)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(target=serve_pages, args=(engine, ports, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the page server did not start")
        return statistics.median(uvloop.run(_reads(engine, ports, seconds)))
    finally:
        server.terminate()
        server.join(5)


def run(reads: int, endpoints: int, seconds: float) -> dict[str, dict[str, float]]:
    results = {}
    for engine in ENGINES:
        read = read_us(engine, endpoints, seconds)
        results[engine] = {
            "page_bytes": len(pages(engine, 1)[0]),
            "parse_us": round(parse_us(engine, reads), 1),
            "read_us": round(read, 1),
            "owner_share_512": round(POOL / INTERVAL * read / 1e6, 2),
        }
    return results


def compare(ref: str, options: list[str], rounds: int) -> dict[str, object]:
    """`run` on epp at git `ref` (before) and on this tree (after), alternately."""
    return alternately(__file__, ref, options, rounds)


def alternately(script: str, ref: str, options: list[str], rounds: int) -> dict[str, object]:
    """`script --json options` on epp at git `ref` (before, from `git
    archive`) and on this tree (after), alternately `rounds` times: each
    run's JSON output."""
    runs: dict[str, list[object]] = {"before": [], "after": []}
    tree = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="epp-bench-before-") as directory:
        archive = subprocess.run(["git", "archive", ref], capture_output=True, check=True, cwd=tree)
        subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        for _ in range(rounds):
            for name, code in (("before", directory), ("after", str(tree))):
                command = [sys.executable, script, "--json", *options]
                env = {**os.environ, "PYTHONPATH": code}
                done = subprocess.run(command, env=env, cwd=code, capture_output=True, check=True)
                runs[name].append(json.loads(done.stdout))
    return {"before_ref": ref, **runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=400, help="parses per run (default 400)")
    parser.add_argument(
        "--endpoints", type=int, default=64, help="endpoints read at once (default 64)"
    )
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="seconds of reading per run (default 2)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--against", metavar="REF", help="epp at git REF, then this tree")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --against")
    args = parser.parse_args(argv)
    if args.against:
        options = ["--reads", str(args.reads), "--endpoints", str(args.endpoints)]
        options += ["--seconds", str(args.seconds)]
        json.dump(compare(args.against, options, args.rounds), sys.stdout, indent=2)
        print()
        return 0
    results = run(args.reads, args.endpoints, args.seconds)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'engine':<14}{'page bytes':>11}{'parse us':>10}{'read us':>9}{'512 at 50 ms':>14}")
    for engine, row in results.items():
        print(
            f"{engine:<14}{row['page_bytes']:>11}{row['parse_us']:>10}{row['read_us']:>9}"
            f"{row['owner_share_512']:>13.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
