"""Reliability of the live system under faults and bad input, through a real Envoy.

    python -m bench.reliability --json [OUT]     # the long runs (5-minute soak)

Every case starts its own stack on loopback (simulated vLLM servers,
`epp serve`, Envoy; `epp.demo.stack`), plays load through Envoy, does
something bad, and stops everything. Each returns a `CaseResult`: requests
sent, requests that ended with an HTTP response (any status; a stream cut
after its 200 counts as answered), requests lost (no response at all: must
be 0), EPP crashes (the EPP process gone without being stopped: must be 0),
malformed inputs tried, and for the soak the growth of the EPP's resident
memory. tests/e2e/test_reliability_*.py run the same cases, smaller.

Cases:
- `server_killed`: one of two model servers is SIGKILLed mid-load. Requests
  on it end with a 5xx from Envoy or a cut stream; requests sent more than
  one scrape interval (plus `settle_s`) after the kill must all complete.
- `disconnect_while_queued`: `clients` requests queue in the EPP behind a
  busy server, then every client hangs up; the EPP's queue size and
  in-flight count (its /metrics) must return to 0.
- `malformed_input`: random bytes, truncated JSON, deeply nested and huge
  JSON, wrong types, invalid UTF-8, a body over --max-body-bytes, thousands
  of headers. Each must be answered 400 or 413 (or 431/413 by Envoy itself
  for header floods), the EPP must stay up, and a good request must still
  complete afterwards.
- `epp_restart`: the EPP is killed under load and started again on the same
  port. Envoy fails closed: requests during the outage get a 5xx; requests
  sent once the EPP is back must complete.
- `soak`: a steady rate for `duration_s`; the EPP's RSS after the run over
  its RSS after a warm-up must grow less than 10%.
- `decider_kill`, `replica_partition`, `rolling_restart`: three replicas of
  one pool under load, their decider killed, one cut off from it, each
  restarted in turn (`bench.reliability_replicas`); `decider_kill_cluster`,
  `rolling_restart_cluster` the same in cluster mode, where the Lease holder
  decides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from epp.demo.loadgen import COMPLETED, LiveRequest, LoadGenerator
from epp.demo.stack import LiveStack, StackSettings, live_stack
from epp.sim.scenario import Objective, Scenario
from epp.sim.scenario_file import parse_scenario
from epp.sim.server_model import ServerParams

SCRAPE_INTERVAL_S = 0.05
log = logging.getLogger("bench.reliability")
OBJECTIVES = (Objective("premium", 10), Objective("standard", 0), Objective("batch", -5))
FAST_SERVER = ServerParams(max_num_seqs=8, decode_ms_per_token=5.0, prefill_overhead_ms=2.0)
HANDLED_MALFORMED = {400, 413, 431}
SOAK_MEMORY_GROWTH_LIMIT = 0.10
LARGE_VALID = ("huge JSON array", "wide JSON object")
"""Valid requests, only large: served (200) or refused by the model server
(400, e.g. longer than its context); either is a clear answer."""


@dataclass(slots=True)
class CaseResult:
    name: str
    sent: int = 0
    answered: int = 0
    lost: int = 0
    epp_crashes: int = 0
    malformed_tried: int = 0
    memory_growth: float | None = None
    wall_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def epp_config(path: Path, max_per_endpoint: int, ttl: str = "60s") -> str:
    """A concurrency-gated EPP config: the EPP, not the servers, holds the queue."""
    path.write_text(
        "apiVersion: llm-d.ai/v1alpha1\n"
        "kind: EndpointPickerConfig\n"
        "flowControl:\n"
        f"  defaultRequestTTL: {ttl}\n"
        f"  gate: {{kinds: [concurrency], maxPerEndpoint: {max_per_endpoint}}}\n"
    )
    return str(path)


def case_settings(
    workdir: Path,
    case: str,
    servers: int,
    max_per_endpoint: int = FAST_SERVER.max_num_seqs,
    params: ServerParams = FAST_SERVER,
    **extra: object,
) -> StackSettings:
    """The stack of one case: simulated servers, the three tiers' objectives,
    and a concurrency-gated EPP config written into `workdir`."""
    return StackSettings(
        servers=servers,
        params=params,
        objectives=OBJECTIVES,
        epp_config=epp_config(workdir / f"{case}.yaml", max_per_endpoint),
        scrape_interval_s=SCRAPE_INTERVAL_S,
        **extra,
    )


def steady_scenario(rate: float, duration: float, output_tokens: int = 20) -> Scenario:
    """Three tenants, one per tier, at `rate` in total, streaming."""
    share = rate / 3
    return parse_scenario(
        {
            "name": "steady",
            "seed": 5,
            "duration_s": duration,
            "pool": {"servers": 1},
            "objectives": [{"name": o.name, "priority": o.priority} for o in OBJECTIVES],
            "tenants": [
                {
                    "name": f"tenant-{o.name}",
                    "objective": o.name,
                    "rate_rps": share,
                    "arrival": "constant",
                    "prompt_tokens": {"uniform": [50, 200]},
                    "output_tokens": output_tokens,
                }
                for o in OBJECTIVES
            ],
            "baselines": [],
        }
    )


def count_requests(result: CaseResult, requests: list[LiveRequest]) -> None:
    result.sent += len(requests)
    result.answered += sum(1 for r in requests if r.answered)
    result.lost += sum(1 for r in requests if not r.answered)
    result.details.setdefault("outcomes", Counter()).update(r.outcome for r in requests)


def finish(result: CaseResult, stack: LiveStack, started: float) -> CaseResult:
    result.epp_crashes += int(stack.epp_crashed())
    result.wall_s = time.monotonic() - started
    if "outcomes" in result.details:
        result.details["outcomes"] = dict(sorted(result.details["outcomes"].items()))
    return result


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def wait_for(condition, timeout: float, interval: float = 0.05) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await condition():
            return True
        await asyncio.sleep(interval)
    return False


# -- cases ---------------------------------------------------------------------------


async def server_killed(
    workdir: Path, rate: float = 40.0, duration: float = 6.0, settle_s: float = 0.25
) -> CaseResult:
    result = CaseResult("server_killed")
    started = time.monotonic()
    settings = case_settings(workdir, "killed", servers=2, server_processes=2)
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        load = LoadGenerator(stack.envoy.url, steady_scenario(rate, duration), timeout=30)
        kill_at = duration / 3

        async def kill() -> float:
            await asyncio.sleep(kill_at)
            stack.server_processes[1].kill()
            return kill_at

        requests, _ = await asyncio.gather(load.run(), kill())
        count_requests(result, requests)
        after = [r for r in requests if r.arrival > kill_at + SCRAPE_INTERVAL_S + settle_s]
        failed_after = [r for r in after if r.outcome != COMPLETED]
        result.details.update(
            killed_endpoint=stack.endpoints[1],
            sent_after_kill_window=len(after),
            failed_after_kill_window=len(failed_after),
            failures_after_kill_s=sorted(round(r.arrival - kill_at, 3) for r in failed_after),
            not_completed_before=sum(
                1 for r in requests if r.arrival <= kill_at and r.outcome != COMPLETED
            ),
        )
        return finish(result, stack, started)


async def disconnect_while_queued(
    workdir: Path, clients: int = 1000, settle_timeout: float = 15.0, holder_tokens: int = 1000
) -> CaseResult:
    result = CaseResult("disconnect_while_queued")
    started = time.monotonic()
    params = ServerParams(max_num_seqs=1, decode_ms_per_token=5.0)
    settings = case_settings(workdir, "disconnect", servers=1, max_per_endpoint=1, params=params)
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        url = f"{stack.envoy.url}/v1/completions"
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            aiohttp.ClientSession() as metrics_session,
        ):

            async def send(tokens: int, objective: str) -> int:
                body = json.dumps({"model": "model", "prompt": "tok " * 20, "max_tokens": tokens})
                headers = {
                    "content-type": "application/json",
                    "x-llm-d-inference-objective": objective,
                    "x-llm-d-inference-fairness-id": f"client-{random.randrange(50)}",
                }
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    return response.status

            holder = asyncio.create_task(send(holder_tokens, "premium"))
            waiters = [
                asyncio.create_task(send(10, OBJECTIVES[i % 3].name)) for i in range(clients)
            ]
            result.sent = clients + 1

            async def all_queued() -> bool:
                return (await stack.epp_metrics(metrics_session)).queued >= clients

            queued_all = await wait_for(all_queued, 30.0)
            peak = await stack.epp_metrics(metrics_session)
            for task in [holder, *waiters]:
                task.cancel()
            await asyncio.gather(holder, *waiters, return_exceptions=True)
            answered = sum(
                1
                for task in [holder, *waiters]
                if not task.cancelled() and task.exception() is None
            )

        async with aiohttp.ClientSession() as metrics_session:

            async def drained() -> bool:
                view = await stack.epp_metrics(metrics_session)
                return view.queued == 0 and view.running == 0

            drained_ok = await wait_for(drained, settle_timeout)
            final = await stack.epp_metrics(metrics_session)
            probe = b'{"model": "model", "prompt": "tok", "max_tokens": 2}'
            try:
                async with metrics_session.post(
                    url,
                    data=probe,
                    headers={"content-type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as response:
                    await response.read()
                    good_after = response.status
            except (aiohttp.ClientError, TimeoutError):
                good_after = 0
        result.answered = answered
        result.lost = int(final.queued + final.running)
        result.details.update(
            all_queued=queued_all,
            peak_queued=peak.queued,
            peak_running=peak.running,
            final_queued=final.queued,
            final_running=final.running,
            drained=drained_ok,
            good_request_after=good_after,
        )
        return finish(result, stack, started)


def malformed_bodies(
    rng: random.Random, max_body: int, deep_nesting: bool = True, large_valid: bool = True
) -> list[tuple[str, bytes]]:
    nesting = 200_000 if deep_nesting else 500
    nested = b"[" * nesting + b"]" * nesting
    huge = json.dumps({"model": "model", "prompt": ["tok"] * 500_000}).encode()
    wide = json.dumps({"model": "model", "prompt": "p", **{f"k{i}": i for i in range(100_000)}})
    large = list(zip(LARGE_VALID, (huge, wide.encode()), strict=True)) if large_valid else []
    return [
        *large,
        *[(f"random bytes {i}", rng.randbytes(rng.randrange(1, 4096))) for i in range(5)],
        ("empty body", b""),
        ("truncated JSON", b'{"model": "model", "prompt": "hel'),
        ("truncated JSON object", b'{"model": "model", '),
        ("not an object", b'["model", "m"]'),
        ("JSON null", b"null"),
        ("wrong type: model", b'{"model": 5, "prompt": "p"}'),
        ("wrong type: prompt", b'{"model": "model", "prompt": {"a": 1}}'),
        ("wrong type: max_tokens", b'{"model": "model", "prompt": "p", "max_tokens": "many"}'),
        ("wrong type: stream", b'{"model": "model", "prompt": "p", "stream": "yes"}'),
        ("missing model", b'{"prompt": "p"}'),
        ("missing prompt", b'{"model": "model"}'),
        ("invalid UTF-8", b'{"model": "model", "prompt": "\xff\xfe\xc3\x28"}'),
        ("lone surrogate", b'{"model": "model", "prompt": "\\ud800"}'),
        ("deeply nested JSON", nested),
        ("body over the limit", b'{"model": "model", "prompt": "' + b"x" * (max_body + 1) + b'"}'),
        ("NaN", b'{"model": "model", "prompt": "p", "max_tokens": NaN}'),
    ]


async def malformed_input(
    workdir: Path,
    header_count: int = 5000,
    deep_nesting: bool = True,
    large_valid: bool = True,
    request_timeout: float = 10.0,
) -> CaseResult:
    result = CaseResult("malformed_input")
    started = time.monotonic()
    max_body = 8 * 1024 * 1024
    settings = case_settings(
        workdir, "malformed", servers=1, epp_args=("--max-body-bytes", str(max_body))
    )
    rng = random.Random(8)
    statuses: dict[str, int] = {}
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        url = f"{stack.envoy.url}/v1/completions"
        pid = stack.epp_pid
        timeout = aiohttp.ClientTimeout(total=request_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def post(name: str, body: bytes, headers: dict[str, str]) -> None:
                result.sent += 1
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        statuses[name] = response.status
                        result.answered += 1
                        log.debug("%s: %d", name, response.status)
                except (aiohttp.ClientError, TimeoutError) as error:
                    statuses[name] = 0
                    result.lost += 1
                    result.details.setdefault("errors", {})[name] = repr(error)

            plain = {"content-type": "application/json"}
            for name, body in malformed_bodies(rng, max_body, deep_nesting, large_valid):
                await post(name, body, plain)
            if header_count:
                flood = {**plain, **{f"x-flood-{i}": "v" * 8 for i in range(header_count)}}
                await post(f"{header_count} headers", b'{"model": "model", "prompt": "p"}', flood)
                big = {**plain, "x-big": "v" * 200_000}
                await post("one 200 KB header", b'{"model": "model", "prompt": "p"}', big)
            bad_ttl = {**plain, "x-llm-d-inference-ttl": "soon"}
            await post("bad TTL header", b'{"model": "model", "prompt": "p"}', bad_ttl)
            result.malformed_tried = result.sent
            await post("good request after", b'{"model": "model", "prompt": "p"}', plain)
        good_after = statuses.pop("good request after")
        unhandled = {
            name: status
            for name, status in statuses.items()
            if status not in HANDLED_MALFORMED and not (name in LARGE_VALID and status == 200)
        }
        result.details.update(
            statuses=statuses,
            unhandled=unhandled,
            good_request_after=good_after,
            epp_pid_unchanged=stack.epp is not None and stack.epp.pid == pid,
        )
        return finish(result, stack, started)


async def epp_restart(
    workdir: Path, rate: float = 30.0, duration: float = 8.0, down_s: float = 1.0
) -> CaseResult:
    result = CaseResult("epp_restart")
    started = time.monotonic()
    settings = case_settings(workdir, "restart", servers=2)
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        load = LoadGenerator(stack.envoy.url, steady_scenario(rate, duration), timeout=30)
        loop = asyncio.get_running_loop()
        begin = loop.time()
        times: dict[str, float] = {}

        async def restart() -> None:
            await asyncio.sleep(duration / 4)
            times["killed"] = loop.time() - begin
            await stack.stop_epp(kill=True)
            await asyncio.sleep(down_s)
            await stack.start_epp()
            times["back"] = loop.time() - begin

        requests, _ = await asyncio.gather(load.run(), restart())
        count_requests(result, requests)
        during = [r for r in requests if times["killed"] + 0.2 <= r.arrival < times["back"]]
        recovery_s = 1.0
        after = [r for r in requests if r.arrival >= times["back"] + recovery_s]
        result.details.update(
            killed_at_s=round(times["killed"], 3),
            back_at_s=round(times["back"], 3),
            statuses_during_outage=dict(Counter(r.status for r in during)),
            sent_during_outage=len(during),
            sent_after_recovery=len(after),
            recovery_allowance_s=recovery_s,
            failed_after_recovery=sum(1 for r in after if r.outcome != COMPLETED),
        )
        return finish(result, stack, started)


async def soak(
    workdir: Path, rate: float = 30.0, duration: float = 300.0, warmup: float = 150.0
) -> CaseResult:
    """Steady load for `warmup` + `duration` seconds; the memory growth is
    measured over `duration`. The warm-up lets the EPP's bounded caches fill
    first (the prefix index keeps up to 31,250 blocks per endpoint, which at
    30 req/s takes about three minutes), so that what is left is a leak."""
    result = CaseResult("soak")
    started = time.monotonic()
    settings = case_settings(workdir, "soak", servers=2)
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        pid = stack.epp_pid
        samples: list[tuple[float, int]] = []

        async def sample() -> None:
            begin = time.monotonic()
            while time.monotonic() - begin < warmup + duration:
                samples.append((round(time.monotonic() - begin, 1), rss_bytes(pid)))
                await asyncio.sleep(1.0)

        load = LoadGenerator(stack.envoy.url, steady_scenario(rate, warmup + duration), timeout=30)
        requests, _ = await asyncio.gather(load.run(), sample())
        count_requests(result, requests)
        baseline = next(rss for at, rss in samples if at >= warmup)
        final = rss_bytes(pid)
        result.memory_growth = (final - baseline) / baseline
        result.details.update(
            rate_rps=rate,
            warmup_s=warmup,
            duration_s=duration,
            rss_after_warmup=baseline,
            rss_final=final,
            rss_max=max(rss for _, rss in samples),
            rss_every_30_s=[rss for at, rss in samples if int(at) % 30 == 0],
        )
        return finish(result, stack, started)


async def decider_kill(workdir: Path) -> CaseResult:
    from bench.reliability_replicas import decider_kill as case

    return await case(workdir)


async def replica_partition(workdir: Path) -> CaseResult:
    from bench.reliability_replicas import replica_partition as case

    return await case(workdir)


async def rolling_restart(workdir: Path) -> CaseResult:
    from bench.reliability_replicas import rolling_restart as case

    return await case(workdir)


async def decider_kill_cluster(workdir: Path) -> CaseResult:
    from bench.reliability_replicas import decider_kill_cluster as case

    return await case(workdir)


async def rolling_restart_cluster(workdir: Path) -> CaseResult:
    from bench.reliability_replicas import rolling_restart_cluster as case

    return await case(workdir)


CASES = {
    "server_killed": server_killed,
    "disconnect_while_queued": disconnect_while_queued,
    "malformed_input": malformed_input,
    "epp_restart": epp_restart,
    "soak": soak,
    "decider_kill": decider_kill,
    "replica_partition": replica_partition,
    "rolling_restart": rolling_restart,
    "decider_kill_cluster": decider_kill_cluster,
    "rolling_restart_cluster": rolling_restart_cluster,
}


async def run_all(names: list[str], workdir: Path, soak_s: float) -> list[CaseResult]:
    results = []
    for name in names:
        if name == "soak":
            result = await soak(workdir, duration=soak_s)
        elif name == "server_killed":
            result = await server_killed(workdir, duration=20.0)
        elif name == "epp_restart":
            result = await epp_restart(workdir, duration=20.0)
        else:
            result = await CASES[name](workdir)
        print(
            f"{result.name}: sent {result.sent}, answered {result.answered}, lost {result.lost}, "
            f"epp crashes {result.epp_crashes}, malformed {result.malformed_tried}, "
            f"memory growth {result.memory_growth}, {result.wall_s:.1f} s",
            flush=True,
        )
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reliability", description=__doc__)
    parser.add_argument(
        "--json", nargs="?", const="-", metavar="OUT", help="write the results as JSON (- stdout)"
    )
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--soak-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="epp-reliability-") as tmp:
        results = asyncio.run(run_all(args.cases, Path(tmp), args.soak_seconds))
    document = {
        "cases": {r.name: asdict(r) for r in results},
        "ok": all(
            r.lost == 0
            and r.epp_crashes == 0
            and (r.memory_growth is None or r.memory_growth < SOAK_MEMORY_GROWTH_LIMIT)
            for r in results
        ),
    }
    text = json.dumps(document, indent=2, default=str)
    if args.json == "-":
        print(text)
    elif args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
