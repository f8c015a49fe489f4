"""End-to-end cost of the EPP: Envoy alone against Envoy + `epp serve`, same run.

    python -m bench.extproc_e2e --json

The model server is Envoy answering by itself (config/envoy/direct.yaml).
The same load goes to it four ways, all of them up for the whole run:
- direct: straight to the model server (the baseline);
- proxy: through a plain Envoy hop (config/envoy/proxy.yaml), to tell
  Envoy's own hop apart;
- floor: through the gateway (config/envoy/envoy.yaml) with ext_proc to
  bench.extproc_floor, a server with no logic on the EPP's transport: what
  any Python ext_proc server costs here;
- epp: through the gateway with ext_proc to `epp serve` (a subprocess),
  which picks the model server as the endpoint. Request and response bodies
  go through ext_proc (FULL_DUPLEX_STREAMED), as in production.

The load: an aiohttp client (keep-alive) posting a 1 KB JSON body to
/v1/completions, first closed loop (`--concurrency` requests always
outstanding, `--seconds`), each way in turn, for throughput; then open loop
at a fixed `--rate` (500 requests/s) for latency, measured from each
request's scheduled send time (so a stall is not hidden), `--rate-seconds`
per way in `--rounds` interleaved rounds (in order, then in reverse): this
machine's speed drifts by tens of percent over a minute, and a way measured
once, after the others, would carry the drift. Stretches shorter than a few
seconds measure transitions rather than a steady rate (more rounds of
shorter stretches gave higher tails on every way). Each stretch starts
after 0.2 s at the rate that is not recorded (the way sat idle while the
others ran), and the client's garbage collector is off while it records.
Prints one JSON object: `direct_rps`,
`epp_rps`, `ratio`, `added_p50_ms`, `added_p99_ms` (EPP percentile minus
direct percentile at the fixed rate), `epp_cpu_us_per_request` (the EPP
process's user+system CPU from /proc/<pid>/stat over the closed-loop run,
per request), `epp_cpu_us_per_request_at_rate` (the same at the fixed rate),
the same for the other paths (`proxy_*`, `floor_*`), the CPU per request of
the load generator (`client_*`, this process) and of the Envoys
(`gateway_*`, `model_server_*`), and the targets.

The machine's cores are shared by the load generator, the Envoys and the
EPP, so the ratio understates what the EPP would do on its own core; the
per-process CPU shows who used them. `--repeat N` runs the whole measure N
times and prints the median of every number (and each run under `runs`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from epp.demo.envoy_process import CONFIG_DIR, RunningEnvoy, running_envoy
from tests.support.epp_process import running_epp

TARGETS = {"ratio": 0.25, "added_p50_ms": 1.0, "added_p99_ms": 5.0}
BODY = json.dumps({"model": "m", "prompt": "x" * 1000, "max_tokens": 1}).encode()
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RESUME_SECONDS = 0.2
"""At the rate, not recorded, before each recorded stretch of a way."""


@dataclass(slots=True)
class ClosedLoop:
    requests: int
    errors: int
    seconds: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds used by this process and by the given subprocesses over
    one or more stretches (`start` ... `stop`)."""

    def __init__(self, **pids: int) -> None:
        self._pids = pids
        self._used = dict.fromkeys([*pids, "client"], 0.0)
        self._started: dict[str, float] | None = None

    def _now(self) -> dict[str, float]:
        now = {name: cpu_seconds(pid) for name, pid in self._pids.items()}
        now["client"] = time.process_time()
        return now

    def start(self) -> None:
        self._started = self._now()

    def stop(self) -> None:
        assert self._started is not None
        end = self._now()
        for name, value in end.items():
            self._used[name] += value - self._started[name]
        self._started = None

    def per_request_us(self, requests: int) -> dict[str, float]:
        return {name: round(used / max(1, requests) * 1e6, 1) for name, used in self._used.items()}


async def closed_loop(url: str, concurrency: int, seconds: float) -> ClosedLoop:
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"content-type": "application/json"}
    done = errors = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def worker() -> None:
            nonlocal done, errors
            while loop.time() < end:
                async with session.post(url, data=BODY, headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        done += 1
                    else:
                        errors += 1

        started = loop.time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return ClosedLoop(done, errors, loop.time() - started)


async def open_loop(
    session: aiohttp.ClientSession, url: str, rate: float, seconds: float
) -> list[float]:
    """Latencies (ms) of requests sent at `rate` per second, from their scheduled time."""
    latencies: list[float] = []
    headers = {"content-type": "application/json"}
    loop = asyncio.get_running_loop()

    async def one(scheduled: float) -> None:
        async with session.post(url, data=BODY, headers=headers) as response:
            await response.read()
        if response.status == 200:
            latencies.append((loop.time() - scheduled) * 1000)

    start = loop.time() + 0.05
    total = int(rate * seconds)
    tasks = []
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    return latencies


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


async def warm_up(url: str) -> None:
    await closed_loop(url, 8, 0.5)


@dataclass(slots=True)
class Way:
    """One way through to the model server: its URL and the processes whose
    CPU it is charged with."""

    url: str
    pids: dict[str, int]


@dataclass(slots=True)
class WayResult:
    """What was measured on one way: closed loop, then at the rate."""

    closed: ClosedLoop
    latencies: list[float]
    cpu_closed: dict[str, float]
    cpu_at_rate: dict[str, float]

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)


@dataclass(slots=True)
class Load:
    concurrency: int
    seconds: float
    rate: float
    rate_seconds: float
    rounds: int = 2
    floor: str = "bench.extproc_floor"
    """The module serving the floor way."""

    async def drive(self, ways: dict[str, Way]) -> dict[str, WayResult]:
        """Each way closed loop in turn, then all at the fixed rate in
        `rounds` interleaved rounds of `rate_seconds / rounds` each (in order,
        then in reverse order, and so on), so that a change in the machine's
        speed during the run falls on every way alike. The load generator's
        garbage collector is off while a stretch at the rate runs."""
        closed: dict[str, tuple[ClosedLoop, dict[str, float]]] = {}
        for name, way in ways.items():
            await warm_up(way.url)
            meter = CpuMeter(**way.pids)
            meter.start()
            run = await closed_loop(way.url, self.concurrency, self.seconds)
            meter.stop()
            closed[name] = (run, meter.per_request_us(run.requests))
        latencies: dict[str, list[float]] = {name: [] for name in ways}
        meters = {name: CpuMeter(**way.pids) for name, way in ways.items()}
        names = list(ways)
        async with contextlib.AsyncExitStack() as stack:
            sessions = {
                name: await stack.enter_async_context(
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                )
                for name in names
            }
            for round_number in range(self.rounds):
                for name in names if round_number % 2 == 0 else names[::-1]:
                    # The way was idle while the others ran: back to steady state first.
                    await open_loop(sessions[name], ways[name].url, self.rate, RESUME_SECONDS)
                    gc.collect()
                    gc.disable()
                    meters[name].start()
                    try:
                        latencies[name] += await open_loop(
                            sessions[name],
                            ways[name].url,
                            self.rate,
                            self.rate_seconds / self.rounds,
                        )
                    finally:
                        meters[name].stop()
                        gc.enable()
        return {
            name: WayResult(
                closed[name][0],
                latencies[name],
                closed[name][1],
                meters[name].per_request_us(len(latencies[name])),
            )
            for name in names
        }


@dataclass(slots=True)
class FloorServer:
    process: asyncio.subprocess.Process
    port: int


@contextlib.asynccontextmanager
async def running_floor(endpoint: str, module: str) -> AsyncIterator[FloorServer]:
    """The floor server (`module`, bench.extproc_floor by default) in a
    subprocess, once its port is known."""
    with tempfile.TemporaryDirectory(prefix="epp-floor-") as directory:
        port_file = Path(directory) / "port"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, endpoint, str(port_file)
        )
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not port_file.exists():
                if process.returncode is not None or loop.time() > deadline:
                    raise RuntimeError(f"{module} did not start")
                await asyncio.sleep(0.05)
            yield FloorServer(process, int(port_file.read_text()))
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()


def url_of(envoy: RunningEnvoy) -> str:
    return f"http://127.0.0.1:{envoy.listen_port}/v1/completions"


async def measure(load: Load) -> dict:
    """Direct, through a plain Envoy hop, through ext_proc to the floor
    server, and through ext_proc to `epp serve`: all four up at once, driven
    as `Load.drive` says."""
    async with contextlib.AsyncExitStack() as stack:
        model_server = await stack.enter_async_context(
            running_envoy(epp_port=0, template=CONFIG_DIR / "direct.yaml")
        )
        model_server_pid = model_server.process.pid
        endpoint = f"127.0.0.1:{model_server.listen_port}"
        proxy = await stack.enter_async_context(
            running_envoy(epp_port=model_server.listen_port, template=CONFIG_DIR / "proxy.yaml")
        )
        floor_server = await stack.enter_async_context(running_floor(endpoint, load.floor))
        floor_gateway = await stack.enter_async_context(running_envoy(epp_port=floor_server.port))
        epp = await stack.enter_async_context(
            running_epp(f"--endpoints={endpoint}", "--log-level=warning")
        )
        gateway = await stack.enter_async_context(running_envoy(epp_port=epp.ports["grpc"]))
        results = await load.drive(
            {
                "direct": Way(url_of(model_server), {"model_server": model_server_pid}),
                "proxy": Way(url_of(proxy), {"gateway": proxy.process.pid}),
                "floor": Way(url_of(floor_gateway), {"epp": floor_server.process.pid}),
                "epp": Way(
                    url_of(gateway),
                    {
                        "epp": epp.process.pid,
                        "gateway": gateway.process.pid,
                        "model_server": model_server_pid,
                    },
                ),
            }
        )
    direct, hop, floor, through_epp = (
        results["direct"],
        results["proxy"],
        results["floor"],
        results["epp"],
    )

    def added(way: WayResult, q: float) -> float:
        return round(way.p(q) - direct.p(q), 3)

    result = {
        "direct_rps": round(direct.closed.rps, 1),
        "epp_rps": round(through_epp.closed.rps, 1),
        "ratio": round(through_epp.closed.rps / direct.closed.rps, 3),
        "direct_p50_ms": round(direct.p(0.5), 3),
        "direct_p99_ms": round(direct.p(0.99), 3),
        "epp_p50_ms": round(through_epp.p(0.5), 3),
        "epp_p99_ms": round(through_epp.p(0.99), 3),
        "added_p50_ms": added(through_epp, 0.5),
        "added_p99_ms": added(through_epp, 0.99),
        "epp_cpu_us_per_request": through_epp.cpu_closed["epp"],
        "epp_cpu_us_per_request_at_rate": through_epp.cpu_at_rate["epp"],
        "proxy_added_p50_ms": added(hop, 0.5),
        "proxy_added_p99_ms": added(hop, 0.99),
        "floor_rps": round(floor.closed.rps, 1),
        "floor_ratio": round(floor.closed.rps / direct.closed.rps, 3),
        "floor_added_p50_ms": added(floor, 0.5),
        "floor_added_p99_ms": added(floor, 0.99),
        "floor_cpu_us_per_request": floor.cpu_closed["epp"],
        "floor_cpu_us_per_request_at_rate": floor.cpu_at_rate["epp"],
        "client_cpu_us_per_request_direct": direct.cpu_closed["client"],
        "client_cpu_us_per_request_epp": through_epp.cpu_closed["client"],
        "model_server_cpu_us_per_request_direct": direct.cpu_closed["model_server"],
        "model_server_cpu_us_per_request_epp": through_epp.cpu_closed["model_server"],
        "gateway_cpu_us_per_request": through_epp.cpu_closed["gateway"],
        "proxy_gateway_cpu_us_per_request": hop.cpu_closed["gateway"],
        "errors": sum(p.closed.errors for p in (direct, hop, floor, through_epp)),
        "rate": load.rate,
        "concurrency": load.concurrency,
        "cores": os.cpu_count(),
    }
    return with_targets(result)


def with_targets(result: dict) -> dict:
    result["targets"] = TARGETS
    result["targets_met"] = (
        result["ratio"] >= TARGETS["ratio"]
        and result["added_p50_ms"] <= TARGETS["added_p50_ms"]
        and result["added_p99_ms"] <= TARGETS["added_p99_ms"]
    )
    return result


async def repeated(times: int, run: Callable[[], Awaitable[dict]]) -> dict:
    """Median of every number over `times` runs of `run`; each run under `runs`."""
    runs = [await run() for _ in range(times)]
    if times == 1:
        return runs[0]
    median = {
        key: round(statistics.median(run[key] for run in runs), 3)
        for key, value in runs[0].items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    median["runs"] = [
        {key: value for key, value in run.items() if key not in ("targets", "targets_met")}
        for run in runs
    ]
    return with_targets(median)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0, help="closed-loop run length")
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop requests/s")
    parser.add_argument(
        "--rate-seconds", type=float, default=10.0, help="open-loop time per way, all rounds"
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved open-loop rounds")
    parser.add_argument("--repeat", type=int, default=1, help="runs; medians are reported")
    parser.add_argument(
        "--floor",
        default="bench.extproc_floor",
        help="module serving the floor way (bench.grpclib_floor: the same server on grpclib)",
    )
    args = parser.parse_args(argv)

    def run() -> Awaitable[dict]:
        return measure(
            Load(
                args.concurrency,
                args.seconds,
                args.rate,
                args.rate_seconds,
                args.rounds,
                args.floor,
            )
        )

    result = asyncio.run(repeated(max(1, args.repeat), run))
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
        print("targets met" if result["targets_met"] else "targets NOT met", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
