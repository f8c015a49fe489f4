"""Three EPP replicas of one pool on loopback, each behind its own Envoy:
one decides (`--decider-port`), two forward to it (`--decider`), in front
of two stand-in model servers with a per-endpoint limit of 3
(`maxPerEndpoint`), so each replica's share is 1. Every request of every
replica is decided by the decider's one core: strict priority holds across
replicas and no endpoint runs more than its limit; a killed decider or a
cut link costs no stream on the survivors, which admit within their share
meanwhile and rejoin when the decider answers again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.support.envoy import running_envoy
from tests.support.epp_process import RunningEpp, objectives_yaml, start_epp
from tests.support.fake_vllm import FakeVllm, running_fake_vllm
from tests.support.waiting import eventually

pytestmark = [pytest.mark.envoy]

LIMIT = 3
CONFIG = f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  gate:
    kinds: [concurrency]
    maxPerEndpoint: {LIMIT}
"""
OBJECTIVES = objectives_yaml("e2e-pool", batch=-1, chat=10)


class Cut:
    """A TCP relay between a replica and its decider that a test can cut
    (every relayed connection closed, new ones refused) and mend."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers -= {writer, up_writer}

    def sever(self) -> None:
        self.cut = True
        for writer in list(self._writers):
            writer.transport.abort()

    def mend(self) -> None:
        self.cut = False

    async def stop(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()


@dataclass
class Pool:
    servers: list[FakeVllm]
    decider: RunningEpp
    replicas: list[RunningEpp]
    urls: list[str]
    """Each replica's Envoy, the decider's first."""
    workdir: Path
    endpoints: str
    later: list[RunningEpp] = field(default_factory=list)
    """EPPs a test started after the pool, stopped with it."""

    def peaks(self) -> list[int]:
        return [server.peak for server in self.servers]


async def start_decider(workdir: Path, endpoints: str, port: int = 0) -> RunningEpp:
    return await start_epp(
        f"--endpoints={endpoints}",
        f"--config-file={workdir / 'config.yaml'}",
        f"--objectives={workdir / 'objectives.yaml'}",
        "--pool-name=e2e-pool",
        f"--decider-port={port}",
        "--replicas=3",
        "--replica-id=decider",
    )


@contextlib.asynccontextmanager
async def replicated_pool(tmp_path: Path, cut: bool = False) -> AsyncIterator[tuple[Pool, Cut]]:
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "objectives.yaml").write_text(OBJECTIVES)
    async with running_fake_vllm() as one, running_fake_vllm() as two:
        endpoints = f"{one.address},{two.address}"
        decider = await start_decider(tmp_path, endpoints)
        decider_port = decider.ports["decider"]
        relay = Cut(decider_port)
        await relay.start()
        replicas = []
        pool: Pool | None = None
        try:
            for index in (1, 2):
                port = relay.port if cut and index == 2 else decider_port
                replicas.append(
                    await start_epp(
                        f"--endpoints={endpoints}",
                        f"--config-file={tmp_path / 'config.yaml'}",
                        f"--objectives={tmp_path / 'objectives.yaml'}",
                        "--pool-name=e2e-pool",
                        f"--decider=127.0.0.1:{port}",
                        "--replicas=3",
                        f"--replica-id=replica-{index}",
                    )
                )
            for replica in replicas:
                await eventually(lambda r=replica: "joined the decider" in r.log(), 10.0)
            async with contextlib.AsyncExitStack() as stack:
                urls = []
                for epp in (decider, *replicas):
                    envoy = await stack.enter_async_context(
                        running_envoy(epp_port=epp.ports["grpc"])
                    )
                    urls.append(f"http://127.0.0.1:{envoy.listen_port}/v1/completions")
                pool = Pool([one, two], decider, replicas, urls, tmp_path, endpoints)
                yield pool, relay
        finally:
            await relay.stop()
            for epp in (*replicas, decider, *(pool.later if pool else ())):
                await epp.terminate()


async def gauge(session: aiohttp.ClientSession, epp: RunningEpp, name: str) -> float:
    async with session.get(epp.metrics_url) as response:
        text = await response.text()
    lines = text.splitlines()
    return next(float(line.split()[-1]) for line in lines if line.startswith(name + " "))


async def complete(
    session: aiohttp.ClientSession, url: str, prompt: str, objective: str, hold_s: float
) -> int:
    body = {"model": "m", "prompt": prompt, "max_tokens": 2, "hold_s": hold_s}
    headers = {"x-llm-d-inference-objective": objective}
    async with session.post(url, data=json.dumps(body), headers=headers) as response:
        await response.read()
        return response.status


def started(pool: Pool) -> list[str]:
    """Prompts in the order the model servers began them."""
    return [r["prompt"] for r in sorted(
        (r for s in pool.servers for r in s.received), key=lambda r: r["at"]
    )]  # fmt: skip


async def test_replicas_serve_higher_bands_first_and_keep_every_endpoint_within_its_limit(
    tmp_path: Path,
) -> None:
    async with replicated_pool(tmp_path) as (pool, _), aiohttp.ClientSession() as session:
        # 6 batch requests fill both endpoints (2 x 3), 6 more wait at the
        # decider; they end 0.15 s apart, so each freed place is one decision
        batch = [
            asyncio.ensure_future(
                complete(session, pool.urls[n % 3], f"batch {n}", "batch", 0.5 + 0.15 * n)
            )
            for n in range(12)
        ]
        await pool.decider.wait_queued(session, 6)
        chat = [
            asyncio.ensure_future(complete(session, pool.urls[n % 3], f"chat {n}", "chat", 2.0))
            for n in range(3)
        ]
        await pool.decider.wait_queued(session, 9)
        statuses = await asyncio.gather(*batch, *chat)
    assert statuses == [200] * 15
    order = [prompt.split()[0] for prompt in started(pool)]
    assert order[6:9] == ["chat"] * 3, " ".join(started(pool))
    assert max(pool.peaks()) <= LIMIT, pool.peaks()


async def steady_load(
    session: aiohttp.ClientSession, urls: list[str], seconds: float, results: list[int]
) -> None:
    """Clients sending back to back through `urls` for `seconds`."""
    deadline = time.monotonic() + seconds

    async def client(n: int) -> None:
        k = 0
        while time.monotonic() < deadline:
            results.append(await complete(session, urls[n % len(urls)], f"c{n}.{k}", "chat", 0.05))
            k += 1

    await asyncio.gather(*(client(n) for n in range(8)))


async def test_killing_the_decider_loses_no_stream_on_the_surviving_replicas(
    tmp_path: Path,
) -> None:
    async with replicated_pool(tmp_path) as (pool, _), aiohttp.ClientSession() as session:
        results: list[int] = []
        load = asyncio.ensure_future(steady_load(session, pool.urls[1:], 4.0, results))
        await asyncio.sleep(1.0)
        before = len(results)
        pool.decider.process.send_signal(signal.SIGKILL)
        await pool.decider.process.wait()
        await eventually(lambda: all("runs degraded" in r.log() for r in pool.replicas), 3.0)
        during = len(results)
        await asyncio.sleep(1.0)
        assert len(results) > during, "admission stopped while no decider answered"
        port = pool.decider.ports["decider"]
        pool.later.append(await start_decider(pool.workdir, pool.endpoints, port))
        await eventually(lambda: all("rejoined the decider" in r.log() for r in pool.replicas), 3.0)
        await load
    assert before > 0
    assert results == [200] * len(results)
    assert max(pool.peaks()) <= LIMIT, pool.peaks()


async def test_a_partitioned_replica_serves_within_its_share_and_rejoins(
    tmp_path: Path,
) -> None:
    async with (
        replicated_pool(tmp_path, cut=True) as (pool, relay),
        aiohttp.ClientSession() as session,
    ):
        cut_off = pool.replicas[1]
        results: list[int] = []
        load = asyncio.ensure_future(steady_load(session, pool.urls, 4.0, results))
        await asyncio.sleep(0.8)
        relay.sever()
        await eventually(lambda: "runs degraded" in cut_off.log(), 3.0)
        assert await gauge(session, cut_off, "epp_replica_degraded") == 1
        served = await gauge(session, cut_off, "epp_replica_degraded_admissions_total")
        await asyncio.sleep(1.0)
        relay.mend()
        mended = time.monotonic()
        await eventually(lambda: "rejoined the decider" in cut_off.log(), 3.0)
        rejoined_after = time.monotonic() - mended
        assert await gauge(session, cut_off, "epp_replica_degraded") == 0
        assert await gauge(session, cut_off, "epp_replica_degraded_admissions_total") > served
        await load
    assert results == [200] * len(results)
    assert max(pool.peaks()) <= LIMIT, pool.peaks()
    assert rejoined_after < 1.0, rejoined_after
