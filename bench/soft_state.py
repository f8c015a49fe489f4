"""Soft state across a change of decider (issue 29): how soon the learned
limits settle after the decider is killed and started again, carried
through the replicas (`TOLD` -> `Decider.seed`, as shipped) against
rebuilt from cold (`bench.rebuilt_decider`: the same `epp serve` with
`Decider.seed` refused, so the new decider starts from the adaptive gate's
`initial` limits). docs/operations/replicas.md.

    python3 -m bench.soft_state [--runs 3] [--cluster]

Three replicas on loopback in file mode (a decider and two forwarding
replicas, each forwarding replica behind its own Envoy), the shipped
default configuration (the adaptive gate), in front of four simulated
model servers that batch 16 (`epp.demo.model_server`, so each limit has a
true value to learn). `bench/scenarios/decider-change.yaml` plays through
the two forwarding replicas' Envoys. At `--kill-at` s the decider gets
SIGKILL and is started again on its port `--down-s` later.

With `--cluster`, the three replicas run in cluster mode against the
emulated API server (`tests.support.kube`), with the e2e tests' Lease of
2 s (`tests.support.replicas.LEASE_S`): the first holds the Lease and
decides, the load goes through the other two, and the holder gets SIGKILL
and is started again `--down-s` later (a pod's restart); one of the other
two takes the Lease when it expires, starting from the limits its own
replica was told (carried) or from `initial` (rebuilt: every replica runs
`bench.rebuilt_decider`). "The new decider serves" is when the Lease names
its new holder.

Sampled every `SAMPLE_S`: the decider's learned limit per endpoint
(`llm_d_epp_flow_control_endpoint_limit`), and each server's waiting
queue (`vllm:num_requests_waiting`). Per run:
- `settle_s`: from the kill until every endpoint's limit stays within 10%
  of its value at the end of the run (the first sample of the new decider
  on which that holds for every sample after it); `settle_after_restart_s`
  the same from when the new decider serves (its start-up, which the load
  on the machine stretches, left out); `back_after_restart_s` the same
  against the limits just before the kill (what the old decider had learned);
- the limits just before the kill, the new decider's first, and the last;
- the most requests one server held (`server_peak`; its batch cap is 16,
  and a probe may take one more), before the kill and after it;
- the top tier's TTFT (client side, streamed) and the servers' summed
  waiting queue in the window from the kill to the settle, in a fixed
  window (`--window-s` after the kill, the same for both modes) and before
  the kill (the same length, ending at it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from epp.demo.loadgen import LiveRequest, LoadGenerator
from epp.demo.processes import Child, start_child
from epp.sim.scenario_file import load_scenario
from epp.sim.workload import workload
from tests.support.envoy import running_envoy
from tests.support.epp_process import RunningEpp, objectives_yaml, start_epp
from tests.support.kube import KubeEmulator, objective, pod
from tests.support.kube import pool as pool_object
from tests.support.metrics_page import MetricsPage
from tests.support.replicas import cluster_replica_args, lease_holder, transitions
from tests.support.waiting import eventually

SCENARIO = Path(__file__).parent / "scenarios/decider-change.yaml"
CONFIG = Path(__file__).parent.parent / "config/epp/default.yaml"
SAMPLE_S = 0.2
WITHIN = 0.10
LIMIT = "llm_d_epp_flow_control_endpoint_limit"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
MODES = ("carried", "rebuilt")
MODULES = {"carried": "epp", "rebuilt": "bench.rebuilt_decider"}


@dataclass(slots=True)
class Timeline:
    """What the samplers saw, in seconds since the load began."""

    limits: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    """The decider's learned limit per endpoint ({}: no decider answered)."""
    waiting: list[tuple[float, float]] = field(default_factory=list)
    """The servers' waiting requests, summed."""
    held: list[tuple[float, list[float]]] = field(default_factory=list)
    """Each server's requests, running and waiting."""


async def page(session: aiohttp.ClientSession, url: str) -> MetricsPage | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as response:
            return MetricsPage.parse(await response.text()) if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def sample(
    session: aiohttp.ClientSession,
    decider: list[RunningEpp | None],
    servers: Sequence[str],
    origin: float,
    timeline: Timeline,
    stop: asyncio.Event,
) -> None:
    """Every `SAMPLE_S` until `stop`: `decider[0]`'s limits (none while
    there is none), the servers' queues."""
    while not stop.is_set():
        now = time.monotonic() - origin
        current = decider[0]
        pages = await asyncio.gather(
            page(session, current.metrics_url) if current is not None else nothing(),
            *(page(session, f"http://{server}/metrics") for server in servers),
        )
        limits = pages[0].by_label("endpoint", LIMIT) if pages[0] is not None else {}
        timeline.limits.append((now, limits))
        servers_now = [p for p in pages[1:] if p is not None]
        timeline.waiting.append((now, sum(p.total(WAITING) for p in servers_now)))
        timeline.held.append((now, [p.total(WAITING) + p.total(RUNNING) for p in servers_now]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


async def nothing() -> None:
    return None


def settled_at(
    limits: list[tuple[float, dict[str, float]]],
    since: float,
    final: dict[str, float] | None = None,
) -> float | None:
    """The first sample time at or after `since` from which every endpoint's
    limit stays within `WITHIN` of `final` (by default its last value; None:
    it never does)."""
    samples = [(t, seen) for t, seen in limits if t >= since]
    if not samples or not samples[-1][1]:
        return None
    final = final or samples[-1][1]
    settled = None
    for t, seen in reversed(samples):
        if all(abs(seen.get(e, 0.0) - v) <= WITHIN * v for e, v in final.items()):
            settled = t
        else:
            break
    return settled


def ttft(requests: Sequence[LiveRequest], tenant: int, begin: float, end: float) -> dict | None:
    """The tenant's TTFT (s) over requests that arrived in [begin, end)."""
    values = sorted(
        r.first_token_at - r.arrival
        for r in requests
        if r.tenant == tenant and begin <= r.arrival < end and r.first_token_at is not None
    )
    if not values:
        return None
    return {
        "n": len(values),
        "p50": round(values[len(values) // 2], 3),
        "p90": round(values[min(len(values) - 1, int(0.9 * len(values)))], 3),
        "max": round(values[-1], 3),
    }


def peak(timeline: Timeline, begin: float, end: float) -> float | None:
    """The most requests one server held (running and waiting) in [begin, end)."""
    return max((max(held) for t, held in timeline.held if begin <= t < end and held), default=None)


def waiting(timeline: Timeline, begin: float, end: float) -> dict | None:
    values = [w for t, w in timeline.waiting if begin <= t < end]
    if not values:
        return None
    return {"mean": round(statistics.fmean(values), 1), "max": max(values)}


@contextlib.asynccontextmanager
async def model_servers(workdir: Path, count: int, params: dict) -> AsyncIterator[list[str]]:
    argv = ["-m", "epp.demo.model_server", f"--count={count}", f"--params={json.dumps(params)}"]
    servers: Child = await start_child("model servers", argv, workdir)
    try:
        yield [f"127.0.0.1:{port}" for port in servers.ready["ports"]]
    finally:
        await servers.stop()


def epp_args(workdir: Path, endpoints: str) -> list[str]:
    return [
        f"--endpoints={endpoints}",
        f"--config-file={CONFIG}",
        f"--objectives={workdir / 'objectives.yaml'}",
        "--pool-name=e2e-pool",
        "--replicas=3",
    ]


class FileReplicas:
    """A decider and two forwarding replicas in file mode; the decider is
    killed and started again on its port."""

    def __init__(self, workdir: Path, servers: Sequence[str], mode: str) -> None:
        self.mode = mode
        base = epp_args(workdir, ",".join(servers))
        self.base = base
        self.decider_args = (*base, "--replica-id=decider")
        self.epps: list[RunningEpp] = []

    async def start(self) -> None:
        self.epps.append(await start_epp(*self.decider_args, "--decider-port=0"))
        port = self.epps[0].ports["decider"]
        for index in (1, 2):
            self.epps.append(
                await start_epp(
                    *self.base, f"--decider=127.0.0.1:{port}", f"--replica-id=replica-{index}"
                )
            )

    async def restart(self, current: list[RunningEpp | None], down_s: float) -> None:
        """Start the killed decider again after `down_s`; back once it serves."""
        port = self.epps[0].ports["decider"]
        await asyncio.sleep(down_s)
        fresh = await start_epp(
            *self.decider_args, f"--decider-port={port}", module=MODULES[self.mode]
        )
        self.epps.append(fresh)
        current[0] = fresh

    async def stop(self) -> None:
        pass


class ClusterReplicas:
    """Three replicas in cluster mode (see the module docstring); the Lease
    holder is killed, started again as a replica, and another one decides."""

    def __init__(self, workdir: Path, kube: KubeEmulator, mode: str) -> None:
        self.workdir = workdir
        self.kube = kube
        self.mode = mode
        self.epps: list[RunningEpp] = []
        self.names = ("epp-a", "epp-b", "epp-c")
        self.restarting: asyncio.Future[None] | None = None

    async def _start(self, name: str) -> RunningEpp:
        args, env = cluster_replica_args(self.workdir, self.kube, name, CONFIG)
        return await start_epp(*args, env=env, module=MODULES[self.mode])

    async def start(self) -> None:
        for name in self.names:
            self.epps.append(await self._start(name))
            if name == "epp-a":
                await eventually(lambda: lease_holder(self.kube) == "epp-a", 20.0)
        for epp in self.epps:
            await eventually(lambda e=epp: "joined the decider" in e.log(), 20.0)

    async def restart(self, current: list[RunningEpp | None], down_s: float) -> None:
        """Start the killed holder again after `down_s` (a pod's restart), in
        the background; back once the Lease names a new holder (the new
        decider), whichever it is."""
        current[0] = None
        held = transitions(self.kube)

        async def again() -> None:
            await asyncio.sleep(down_s)
            self.epps.append(await self._start("epp-a"))

        self.restarting = asyncio.ensure_future(again())
        await eventually(lambda: transitions(self.kube) > held, 60.0)
        holder = lease_holder(self.kube)
        if holder == "epp-a":
            await self.restarting
            current[0] = self.epps[-1]
        else:
            current[0] = self.epps[self.names.index(holder or "")]

    async def stop(self) -> None:
        if self.restarting is not None:
            await self.restarting


def cluster_pool(kube: KubeEmulator, servers: Sequence[str], objectives: dict[str, int]) -> None:
    """The pool in the emulated API server: one pod on loopback, a target port per server."""
    ports = tuple(int(server.rsplit(":", 1)[1]) for server in servers)
    kube.apply(pool_object("e2e-pool", selector={"app": "vllm"}, ports=ports))
    kube.apply(pod("vllm-0", "127.0.0.1", {"app": "vllm"}))
    for name, priority in objectives.items():
        kube.apply(objective(name, priority, pools=("e2e-pool",)))


async def one_run(
    mode: str,
    kill_at: float,
    down_s: float,
    window_s: float,
    timelines: Path | None = None,
    cluster: bool = False,
) -> dict:
    scenario = load_scenario(SCENARIO)
    params = asdict(scenario.pool.groups[0].params)
    premium = next(i for i, t in enumerate(scenario.tenants) if t.objective == "premium")
    priorities = {o.name: o.priority for o in scenario.objectives}
    with tempfile.TemporaryDirectory(prefix="soft-state-") as directory:
        workdir = Path(directory)
        (workdir / "objectives.yaml").write_text(objectives_yaml("e2e-pool", **priorities))
        count = scenario.pool.groups[0].servers
        async with (
            model_servers(workdir, count, params) as servers,
            KubeEmulator() as kube,
        ):
            if cluster:
                cluster_pool(kube, servers, priorities)
            replicas = (
                ClusterReplicas(workdir, kube, mode)
                if cluster
                else FileReplicas(workdir, servers, mode)
            )
            epps = replicas.epps
            try:
                await replicas.start()
                async with contextlib.AsyncExitStack() as stack:
                    urls = []
                    for epp in epps[1:]:
                        envoy = await stack.enter_async_context(
                            running_envoy(epp_port=epp.ports["grpc"])
                        )
                        urls.append(f"http://127.0.0.1:{envoy.listen_port}")
                    generator = LoadGenerator(urls, scenario, workload(scenario), timeout=90.0)
                    session = await stack.enter_async_context(aiohttp.ClientSession())
                    timeline = Timeline()
                    stop = asyncio.Event()
                    origin = time.monotonic()
                    load = asyncio.ensure_future(generator.run())
                    current: list[RunningEpp | None] = [epps[0]]
                    sampler = asyncio.ensure_future(
                        sample(session, current, servers, origin, timeline, stop)
                    )
                    await asyncio.sleep(kill_at - (time.monotonic() - origin))
                    before = timeline.limits[-1][1]
                    killed = time.monotonic() - origin
                    epps[0].process.send_signal(signal.SIGKILL)
                    await epps[0].process.wait()
                    await replicas.restart(current, down_s)
                    restarted = time.monotonic() - origin
                    requests = await load
                    stop.set()
                    await sampler
                    await replicas.stop()
                    log = current[0].log() if current[0] is not None else ""
                    if timelines is not None:
                        (timelines / f"{mode}-{int(time.time())}.log").write_text(log)
            finally:
                for epp in epps:
                    await epp.terminate()
    # the generator's times run from its own origin, within a few ms of ours
    shift = generator.origin - origin
    for request in requests:
        request.arrival += shift
        if request.first_token_at is not None:
            request.first_token_at += shift
    if timelines is not None:
        timelines.mkdir(parents=True, exist_ok=True)
        (timelines / f"{mode}-{int(time.time())}.json").write_text(
            json.dumps({"killed": killed, "restarted": restarted, **asdict(timeline)})
        )
    settled = settled_at(timeline.limits, restarted)
    back = settled_at(timeline.limits, restarted, before)
    settle_end = settled if settled is not None else timeline.limits[-1][0]
    first = next((seen for t, seen in timeline.limits if t >= restarted and seen), {})
    return {
        "mode": mode,
        "cluster": cluster,
        "seeded": "learned limits of epoch" in log,
        "killed_s": round(killed, 2),
        "restarted_after_s": round(restarted - killed, 2),
        "settle_s": None if settled is None else round(settled - killed, 2),
        "settle_after_restart_s": None if settled is None else round(settled - restarted, 2),
        "back_after_restart_s": None if back is None else round(back - restarted, 2),
        "limits_before": before,
        "limits_first": first,
        "limits_last": timeline.limits[-1][1],
        "ttft_top": {
            "before": ttft(requests, premium, killed - window_s, killed),
            "settling": ttft(requests, premium, killed, settle_end),
            "window": ttft(requests, premium, killed, killed + window_s),
        },
        "server_waiting": {
            "before": waiting(timeline, killed - window_s, killed),
            "settling": waiting(timeline, killed, settle_end),
            "window": waiting(timeline, killed, killed + window_s),
        },
        "server_peak": {
            "before": peak(timeline, killed - window_s, killed),
            "window": peak(timeline, killed, killed + window_s),
        },
        "completed": sum(1 for r in requests if r.outcome == "completed"),
        "requests": len(requests),
        "load_average": os.getloadavg()[0],
    }


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(runs: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue

        def values(*path: str, runs: list[dict] = mine) -> list[float]:
            found = []
            for run in runs:
                value = run
                for key in path:
                    value = value.get(key) if isinstance(value, dict) else None
                if value is not None:
                    found.append(value)
            return found

        out[mode] = {
            "runs": len(mine),
            "unsettled": sum(1 for r in mine if r["settle_s"] is None),
            "settle_s": spread(values("settle_s")),
            "settle_after_restart_s": spread(values("settle_after_restart_s")),
            "back_after_restart_s": spread(values("back_after_restart_s")),
            "restarted_after_s": spread(values("restarted_after_s")),
            "ttft_top_p90_window": spread(values("ttft_top", "window", "p90")),
            "ttft_top_p90_before": spread(values("ttft_top", "before", "p90")),
            "server_waiting_max_window": spread(values("server_waiting", "window", "max")),
            "server_waiting_mean_window": spread(values("server_waiting", "window", "mean")),
            "server_peak_window": spread(values("server_peak", "window")),
        }
    return out


async def run(
    runs: int,
    modes: Sequence[str],
    kill_at: float,
    down_s: float,
    window_s: float,
    timelines: Path | None,
    cluster: bool = False,
) -> dict:
    results = []
    for n in range(runs):
        for mode in modes:
            result = await one_run(mode, kill_at, down_s, window_s, timelines, cluster)
            result["run"] = n
            results.append(result)
            print(json.dumps(result), flush=True)
    return {"runs": results, "summary": summary(results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.soft_state", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--kill-at", type=float, default=25.0)
    parser.add_argument("--down-s", type=float, default=0.5)
    parser.add_argument("--window-s", type=float, default=15.0)
    parser.add_argument("--timelines", type=Path, help="write each run's samples here (JSON)")
    parser.add_argument("--cluster", action="store_true", help="cluster mode: the Lease holder")
    args = parser.parse_args(argv)
    report = asyncio.run(
        run(
            args.runs,
            args.modes,
            args.kill_at,
            args.down_s,
            args.window_s,
            args.timelines,
            args.cluster,
        )
    )
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
