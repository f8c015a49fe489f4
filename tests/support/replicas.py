"""Three EPP replicas of one pool on loopback, each behind its own Envoy
(docs/operations/replicas.md), in front of two stand-in model servers with
a limit of `LIMIT` requests each (`maxPerEndpoint`).

File mode: a decider (`--decider-port`) and two forwarding replicas
(`--decider`), one of them optionally through a relay a test can cut.

    async with replicated_pool(tmp_path) as (pool, relay):
        pool.urls[0]  # the decider's Envoy; pool.urls[1:] the replicas'

Cluster mode: three replicas against the emulated API server
(`tests.support.kube`), each with `--decider-port` and leader election on
`LEASE_S` timings; the first one started holds the Lease and decides.

    async with clustered_pool(tmp_path, kube) as pool:
        pool.decider  # the Lease holder; pool.replicas the other two
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from epp.k8s.leader import lease_name
from tests.support.envoy import running_envoy
from tests.support.epp_process import RunningEpp, objectives_yaml, start_epp
from tests.support.fake_vllm import FakeVllm, running_fake_vllm
from tests.support.kube import KubeEmulator, objective, pod
from tests.support.kube import pool as pool_object
from tests.support.waiting import eventually

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
LEASE_S = (2.0, 1.0, 0.1)
"""Cluster mode's lease duration, renew deadline and retry period: a holder
killed without releasing the Lease is replaced after about 2 s."""


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


async def start_decider(workdir: Path, endpoints: str, port: int = 0, *args: str) -> RunningEpp:
    return await start_epp(
        f"--endpoints={endpoints}",
        f"--config-file={workdir / 'config.yaml'}",
        f"--objectives={workdir / 'objectives.yaml'}",
        "--pool-name=e2e-pool",
        f"--decider-port={port}",
        "--replicas=3",
        "--replica-id=decider",
        *args,
    )


def config_with_fairness(policy: str) -> str:
    """`CONFIG` with every band's fairness policy `policy` (a plugin type)."""
    return CONFIG.replace(
        "flowControl:\n",
        f"plugins:\n- type: {policy}\nflowControl:\n"
        f"  defaultPriorityBand:\n    fairnessPolicyRef: {policy}\n",
    )


async def start_replica(
    workdir: Path, endpoints: str, decider_port: int, index: int, *args: str
) -> RunningEpp:
    """Forwarding replica `replica-{index}` of the pool, its decider on `decider_port`."""
    return await start_epp(
        f"--endpoints={endpoints}",
        f"--config-file={workdir / 'config.yaml'}",
        f"--objectives={workdir / 'objectives.yaml'}",
        "--pool-name=e2e-pool",
        f"--decider=127.0.0.1:{decider_port}",
        "--replicas=3",
        f"--replica-id=replica-{index}",
        *args,
    )


@contextlib.asynccontextmanager
async def replicated_pool(
    tmp_path: Path,
    cut: bool = False,
    decider_args: tuple[str, ...] = (),
    config: str = CONFIG,
    args: tuple[str, ...] = (),
) -> AsyncIterator[tuple[Pool, Cut]]:
    """`args` go to every replica, `decider_args` to the decider only."""
    (tmp_path / "config.yaml").write_text(config)
    (tmp_path / "objectives.yaml").write_text(OBJECTIVES)
    async with running_fake_vllm() as one, running_fake_vllm() as two:
        endpoints = f"{one.address},{two.address}"
        decider = await start_decider(tmp_path, endpoints, 0, *args, *decider_args)
        decider_port = decider.ports["decider"]
        relay = Cut(decider_port)
        await relay.start()
        replicas = []
        pool: Pool | None = None
        try:
            for index in (1, 2):
                port = relay.port if cut and index == 2 else decider_port
                replicas.append(await start_replica(tmp_path, endpoints, port, index, *args))
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


def cluster_replica_args(
    workdir: Path, kube: KubeEmulator, name: str, config: Path | None = None
) -> tuple[list[str], dict]:
    """The flags and environment of cluster-mode replica `name` (its pod name
    too); its configuration `config`, by default `workdir`'s config.yaml."""
    duration, renew, retry = LEASE_S
    args = [
        f"--config-file={config or workdir / 'config.yaml'}",
        "--pool-name=e2e-pool",
        "--ha-enable-leader-election",
        "--metrics-endpoint-auth=false",
        f"--ha-lease-duration={duration}s",
        f"--ha-renew-deadline={renew}s",
        f"--ha-retry-period={retry}s",
        "--decider-port=0",
        "--replicas=3",
        f"--replica-id={name}",
    ]
    env = {
        "KUBECONFIG": kube.write_kubeconfig(workdir / "kubeconfig"),
        "NAMESPACE": "default",
        "POD_NAME": name,
    }
    return args, env


def lease(kube: KubeEmulator) -> dict | None:
    """The pool's Lease in `kube` (None: not created yet)."""
    return kube.objects.get(
        (("coordination.k8s.io", "leases"), "default", lease_name("default", "e2e-pool"))
    )


def lease_holder(kube: KubeEmulator) -> str | None:
    found = lease(kube)
    return found["spec"].get("holderIdentity") if found else None


def transitions(kube: KubeEmulator) -> int:
    """The Lease's `leaseTransitions`: one more at every new holder."""
    found = lease(kube)
    return int(found["spec"].get("leaseTransitions") or 0) if found else 0


@contextlib.asynccontextmanager
async def clustered_pool(tmp_path: Path, kube: KubeEmulator) -> AsyncIterator[Pool]:
    (tmp_path / "config.yaml").write_text(CONFIG)
    async with running_fake_vllm() as one, running_fake_vllm() as two:
        ports = tuple(int(server.address.rsplit(":", 1)[1]) for server in (one, two))
        kube.apply(pool_object("e2e-pool", selector={"app": "vllm"}, ports=ports))
        kube.apply(pod("vllm-0", "127.0.0.1", {"app": "vllm"}))
        kube.apply(objective("batch", -1, pools=("e2e-pool",)))
        kube.apply(objective("chat", 10, pools=("e2e-pool",)))
        epps: list[RunningEpp] = []
        pool: Pool | None = None
        try:
            for name in ("epp-a", "epp-b", "epp-c"):
                args, env = cluster_replica_args(tmp_path, kube, name)
                epps.append(await start_epp(*args, env=env))
                if name == "epp-a":
                    await eventually(lambda: lease_holder(kube) == "epp-a", 10.0)
            for epp in epps:
                await eventually(lambda e=epp: "joined the decider" in e.log(), 10.0)
            async with contextlib.AsyncExitStack() as stack:
                urls = []
                for epp in epps:
                    envoy = await stack.enter_async_context(
                        running_envoy(epp_port=epp.ports["grpc"])
                    )
                    urls.append(f"http://127.0.0.1:{envoy.listen_port}/v1/completions")
                pool = Pool([one, two], epps[0], epps[1:], urls, tmp_path, "")
                yield pool
        finally:
            for epp in (*epps, *(pool.later if pool else ())):
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
