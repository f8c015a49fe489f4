"""The core owner's CPU per request under `--workers`, without Envoy:
`python -m bench.owner [--json] [--endpoints N] [--profile FILE]`.

The owner is `epp serve --workers 1`'s, built by `EppParts` from the same
flags (`--endpoints` of N loopback addresses, scraping off, the default
configuration): its core, its metrics, its `Owner`. Its one worker is a
scripted process on the other end of a real socketpair that speaks the
worker's side of `epp.serve.wire`: it keeps `--concurrency` requests
open (ARRIVE, built as the stream machine builds a request from Envoy's
headers and a 1 KB completion body, hashed as a worker hashes it), and
once all of them are decided sends their COMPLETEs (a 1-token response
each) and the next `--concurrency` arrivals in one frame: every run
batches alike, so the owner's CPU per request does not move with how
busy the machine is. `--gap-ms G` holds each round's frame back G ms
after the round was decided, so the owner sleeps between frames as at a
fixed rate (`--concurrency 1 --gap-ms 5`: a request each 5 ms, as
bench.workers' 200/s). So every
request costs the owner what it costs behind a real worker (frame decode,
the rebuild, the priority, screen, offer, the pick, the metrics hooks,
the decision's frame, the completion), and nothing of the protocol work.

CPU is this process's (the owner's: user + system) over `--requests`
requests, after `--warmup` of them; the worker's is not counted. `pick_us`
is the mean of the scheduler's calls as `scheduler_e2e_duration_seconds`
times them (wall time, so it includes any preemption). With
`--fresh` the endpoints carry fresh metrics (as under a 50 ms scrape) and
`--reads R` of them per second change (each a new snapshot); without it
they are never read, as in `bench.workers` (scraping at 1 h): stale.

The loop and the heap are the server's (`epp.serve.command`: uvloop when
installed, start-up frozen out of the collector). A quick A/B of
owner-side changes (`farm-bench` pairs two runs); the figure the issue
judges is `bench.workers`' owner share through Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import socket
import sys
import time

from epp.flowcontrol.request import FlowRequest
from epp.scheduling.endpoint import EndpointMetrics
from epp.scheduling.prefix import block_hashes
from epp.scheduling.request import InferenceRequest
from epp.serve import wire
from epp.serve.assembly import EppParts
from epp.serve.command import loop_factory, settle_heap
from epp.serve.options import ServeOptions
from epp.serve.owner import WorkerSlot

PROMPT = "x" * 1000
"""bench.extproc_e2e's body's prompt (the same for every request)."""
HEADERS = {
    ":authority": "127.0.0.1:8081",
    ":path": "/v1/completions",
    ":method": "POST",
    ":scheme": "http",
    "content-type": "application/json",
    "content-length": "1043",
    "user-agent": "Python/3.11 aiohttp/3.9.5",
    "x-forwarded-proto": "http",
    "x-request-id": "",
    "x-envoy-expected-rq-timeout-ms": "15000",
}
"""What Envoy's ext_proc filter sends for bench.extproc_e2e's requests."""


def worker_main(fd: int, concurrency: int, total: int, gap: float) -> None:
    """The scripted worker: `concurrency` requests open until `total` were
    sent, each round's frame `gap` seconds after the round was decided."""
    asyncio.run(_worker(fd, concurrency, total, gap))


async def _worker(fd: int, concurrency: int, total: int, gap: float) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    geometry: list[tuple[int, int] | None] = [None]
    sent = [0]
    decided: list[int] = []
    link: wire.Link

    def arrive() -> None:
        rid = sent[0]
        sent[0] += 1
        headers = dict(HEADERS, **{"x-request-id": f"req-{rid}"})
        request = FlowRequest(
            request_id=headers["x-request-id"],
            fairness_id="default-flow",
            priority=0,
            arrival=time.monotonic(),
            byte_size=1043,
            input_tokens=250,
            payload=InferenceRequest(
                model="m", target_model="m", prompt=PROMPT, max_tokens=1, headers=headers
            ),
        )
        shape = geometry[0]
        if shape is not None:
            hashes = block_hashes(PROMPT, "m", shape[0], shape[1])
            request.payload.prefix_hashes = (shape[0], shape[1], hashes)
        link.send([wire.ARRIVE, rid, *wire.arrival_fields(request)])

    def on_messages(messages: list[wire.Message]) -> None:
        for message in messages:
            kind = message[0]
            if kind == wire.GEOMETRY:
                geometry[0] = (message[1], message[2]) if message[1] else None
            elif kind == wire.DECISION:
                decided.append(message[1])
        if len(decided) == concurrency:
            if gap:
                loop.call_later(gap, next_round)
            else:
                next_round()

    def next_round() -> None:
        # A whole round decided: its completions and the next round's
        # arrivals in one frame, so every run batches alike.
        for rid in decided:
            link.send([wire.COMPLETE, rid, 256, 1, None])
        decided.clear()
        if sent[0] < total:
            for _ in range(concurrency):
                arrive()
        elif not done.done():
            done.set_result(None)

    link = wire.Link(on_messages, lambda: done.done() or done.set_result(None))
    sock = socket.socket(fileno=fd)
    await loop.connect_accepted_socket(lambda: link, sock)
    link.send([wire.SERVING])
    await asyncio.sleep(0.2)  # the GEOMETRY first
    for _ in range(concurrency):
        arrive()
    await done
    link.close()


def fresh_reads(parts: EppParts, per_second: float, stop: asyncio.Event) -> asyncio.Task[None]:
    """Endpoints' metrics read round robin, `per_second` reads changing one
    endpoint's values each (as the workers' METRICS reach the owner: the
    store, then one poke per turn); at 640/s a 64-endpoint pool stays fresh."""

    async def run() -> None:
        store = parts.store
        addresses = store.addresses()
        admission = parts.admission
        turn = 0
        each = max(1, round(per_second / 100))
        while not stop.is_set():
            now = time.monotonic()
            for _ in range(each):
                waiting = float(turn // len(addresses) % 3)
                metrics = EndpointMetrics(waiting=waiting, updated_at=now)
                store.set_metrics(addresses[turn % len(addresses)], metrics)
                turn += 1
            admission.poke()
            await asyncio.sleep(0.01)

    return asyncio.get_running_loop().create_task(run())


async def measure(args: argparse.Namespace) -> dict:
    pool = ",".join(f"127.0.0.{n}:8000" for n in range(1, args.endpoints + 1))
    options = ServeOptions(
        endpoints=pool, workers=1, refresh_metrics_interval=3600.0, seed=args.seed
    )
    parts = EppParts(options)
    owner = parts.owner
    assert owner is not None
    slot: WorkerSlot = owner.slots[0]
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    total = args.warmup + args.requests
    child = os.fork()
    if child == 0:
        mine.close()
        worker_main(theirs.detach(), args.concurrency, total, args.gap_ms / 1000)
        os._exit(0)
    theirs.close()
    owner.publish_endpoints([e.address for e in parts.store.snapshot().endpoints])
    link = await owner.attach(slot, mine)
    owner._publish_geometry(parts.admission)
    settle_heap()
    stop = asyncio.Event()
    reads = fresh_reads(parts, args.reads, stop) if args.fresh else None
    profile = cProfile.Profile() if args.profile else None
    while slot.arrivals < args.warmup and not link.closed:
        await asyncio.sleep(0.01)
    start_cpu, start_wall, start_count = time.process_time(), time.monotonic(), slot.arrivals
    picks = parts.scheduler_latency
    start_picks, start_pick_s = picks.count, picks.total
    if profile is not None:
        profile.enable()
    while not link.closed:
        await asyncio.sleep(0.01)
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    cpu, wall = time.process_time() - start_cpu, time.monotonic() - start_wall
    count = slot.arrivals - start_count
    pick_s, pick_count = picks.total - start_pick_s, picks.count - start_picks
    stop.set()
    if reads is not None:
        await reads
    os.waitpid(child, 0)
    return {
        "endpoints": args.endpoints,
        "fresh": args.fresh,
        "requests": count,
        "owner_cpu_us_per_request": round(cpu / count * 1e6, 1),
        "pick_us": round(pick_s / max(pick_count, 1) * 1e6, 1),
        "requests_per_s": round(count / wall, 1),
        "concurrency": args.concurrency,
        "gap_ms": args.gap_ms,
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--endpoints", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--gap-ms", type=float, default=0.0, help="idle time before each round's frame"
    )
    parser.add_argument("--fresh", action="store_true", help="fresh metrics, changing")
    parser.add_argument("--reads", type=float, default=640.0, help="changed reads per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", metavar="FILE", help="cProfile the measured part to FILE")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        result = runner.run(measure(args))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
