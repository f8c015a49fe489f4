"""The whole live system on loopback: simulated model servers, `epp serve`, a real Envoy.

    async with live_stack(StackSettings(...)) as stack:
        url = stack.envoy.url          # send inference requests here

Each part is started in order (model servers, EPP, Envoy) and waited for;
a part that fails to start raises `PartFailed` naming it, after the parts
already running are stopped. On exit (also on cancellation, e.g. Ctrl-C)
everything is stopped in reverse order and the work directory is removed.

The EPP runs as `python -m epp serve` with files written into the work
directory from the settings: an InferencePool, one InferenceObjective per
objective, and the endpoints (`@FILE`, reloaded when changed: the
reference's file-discovery document, each endpoint labelled with the
engine the servers pose as, `llm-d.ai/engine-type`, and its
`llm-d.ai/role` when the servers have roles).

With roles (prefill/decode disaggregation), every server that can decode
gets a routing sidecar (`epp.demo.sidecar`) in front of it, as a decode pod
has, and the EPP's endpoint for it is the sidecar; a prefill-only server is
its own endpoint.

The EPP's ext_proc port is chosen at the first start and kept, so
`restart_epp()` brings it back where Envoy expects it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from epp.api.address import parse_address
from epp.datalayer.engines import ENGINE_LABEL
from epp.demo.envoy_process import DEFAULT_TEMPLATE, RunningEnvoy, running_envoy
from epp.demo.processes import Child, start_child
from epp.scheduling.filters import DECODE_ROLES, ROLE_LABEL
from epp.sim.scenario import KvTransfer, Objective
from epp.sim.server_model import ServerParams

POOL_NAME = "demo-pool"
NAMESPACE = "default"


@dataclass(slots=True, frozen=True)
class StackSettings:
    servers: int = 2
    params: ServerParams = field(default_factory=ServerParams)
    objectives: tuple[Objective, ...] = ()
    epp_config: str | None = None
    """EndpointPickerConfig file; None: the EPP's defaults."""
    model: str = "model"
    engine: str = "vllm"
    """The engine the model servers pose as (vllm, sglang, trtllm-serve)."""
    label_engine: bool = True
    """Label each endpoint with the engine; otherwise the EPP's configuration
    must name it (core-metrics-extractor's defaultEngine)."""
    scrape_interval_s: float = 0.05
    server_processes: int = 1
    """The servers are split over this many processes (one per server lets a test kill one)."""
    epp_args: tuple[str, ...] = ()
    envoy_template: Path = DEFAULT_TEMPLATE
    envoy_listen_port: int = 0
    """Envoy's listener for clients (0: a free port)."""
    epp_metrics_port: int = 0
    """The EPP's /metrics port (0: a free port)."""
    epp_grace_s: float = 0.0
    """The EPP's drain window (`--drain-timeout`): none, since the stack
    stops Envoy before the EPP, so no gateway is left to drain for."""
    roles: tuple[str, ...] = ()
    """Server i's `llm-d.ai/role` ("" none); empty: no server has a role."""
    kv_transfer: KvTransfer = field(default_factory=KvTransfer)
    server_timing_log: Path | None = None
    """Where the model servers append each answered request's times
    (`epp.demo.model_server --timing-log`); None: not written."""
    kv_events_port: int = 0
    """The port each server publishes its KV-cache events on (0: none); the
    servers then listen on loopback addresses of their own (`server_hosts`),
    as pods have, so the EPP finds each one's events at its address."""
    tokenizer: Path | None = None
    """A model directory whose tokenizer.json the servers tokenize with."""

    def server_hosts(self) -> list[str]:
        if not self.kv_events_port:
            return ["127.0.0.1"] * self.servers
        return event_hosts(self.servers)

    def decodes(self, index: int) -> bool:
        """Whether server `index` serves the decode stage (and so has a sidecar)."""
        role = self.roles[index] if self.roles else ""
        return not role or role in DECODE_ROLES


def event_hosts(servers: int) -> list[str]:
    """The loopback addresses of `servers` servers that publish KV-cache events."""
    return [f"127.0.0.{2 + index}" for index in range(servers)]


def pool_manifest() -> dict:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": POOL_NAME, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": POOL_NAME}},
            "targetPorts": [{"number": 8000}],
        },
    }


def objective_manifest(objective: Objective) -> dict:
    return {
        "apiVersion": "llm-d.ai/v1",
        "kind": "InferenceObjective",
        "metadata": {"name": objective.name, "namespace": NAMESPACE},
        "spec": {"priority": objective.priority, "poolRefs": [{"name": POOL_NAME}]},
    }


@dataclass(slots=True)
class EppMetricsView:
    """The numbers of the EPP's /metrics a reliability check needs."""

    queued: float
    running: float
    saturation: float | None


def read_epp_metrics(text: str) -> EppMetricsView:
    queued = running = 0.0
    saturation = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "llm_d_epp_flow_control_queue_size":
                queued += sample.value
            elif sample.name == "llm_d_epp_request_running":
                running += sample.value
            elif (
                sample.name == "llm_d_epp_flow_control_pool_saturation"
                and sample.labels.get("stage") == "effective"
            ):
                saturation = sample.value
    return EppMetricsView(queued, running, saturation)


class LiveStack:
    """The running parts; see the module docstring."""

    def __init__(self, settings: StackSettings, workdir: Path) -> None:
        self.settings = settings
        self.workdir = workdir
        self.server_processes: list[Child] = []
        self.servers: list[str] = []
        """The model servers' own addresses, in the settings' order."""
        self.endpoints: list[str] = []
        """The EPP's endpoints: a server's sidecar when it has one, else the server."""
        self.sidecars: Child | None = None
        self.epp: Child | None = None
        self.epp_port = 0
        self.envoy: RunningEnvoy | None = None
        self._epp_stopped = False

    # -- model servers -----------------------------------------------------------

    async def start_servers(self) -> None:
        settings = self.settings
        processes = max(1, min(settings.server_processes, settings.servers))
        counts = [
            settings.servers // processes + (1 if i < settings.servers % processes else 0)
            for i in range(processes)
        ]
        params = json.dumps(asdict(settings.params))
        transfer = json.dumps(asdict(settings.kv_transfer))
        hosts = settings.server_hosts()
        for index, count in enumerate(counts):
            first = sum(counts[:index])
            own = hosts[first : first + count]
            name = "model servers" if processes == 1 else f"model server {index}"
            child = await start_child(
                name,
                [
                    "-m",
                    "epp.demo.model_server",
                    "--count",
                    str(count),
                    "--model",
                    settings.model,
                    "--params",
                    params,
                    "--engine",
                    settings.engine,
                    "--kv-transfer",
                    transfer,
                    *(
                        ("--timing-log", str(settings.server_timing_log))
                        if settings.server_timing_log is not None
                        else ()
                    ),
                    *(
                        ("--hosts", ",".join(own), "--kv-events-port", str(settings.kv_events_port))
                        if settings.kv_events_port
                        else ()
                    ),
                    *(("--tokenizer", str(settings.tokenizer)) if settings.tokenizer else ()),
                ],
                self.workdir,
            )
            self.server_processes.append(child)
            ports = child.ready["ports"]
            self.servers.extend(f"{h}:{port}" for h, port in zip(own, ports, strict=True))
        self.endpoints = list(self.servers)
        if settings.roles:
            await self._start_sidecars()

    async def _start_sidecars(self) -> None:
        decoding = [i for i in range(len(self.servers)) if self.settings.decodes(i)]
        if not decoding:
            return
        decoders = ",".join(self.servers[i] for i in decoding)
        self.sidecars = await start_child(
            "sidecars",
            ["-m", "epp.demo.sidecar", "--decoders", decoders, "--bind-address", "127.0.0.1"],
            self.workdir,
        )
        for index, port in zip(decoding, self.sidecars.ready["ports"], strict=True):
            self.endpoints[index] = f"127.0.0.1:{port}"

    # -- the EPP -------------------------------------------------------------------

    def _write_inputs(self) -> list[str]:
        work = self.workdir
        (work / "pool.yaml").write_text(yaml.safe_dump(pool_manifest()))
        (work / "objectives.yaml").write_text(
            yaml.safe_dump_all([objective_manifest(o) for o in self.settings.objectives])
        )
        (work / "endpoints.yaml").write_text(yaml.safe_dump(self.endpoints_document()))
        args = ["--pool", str(work / "pool.yaml"), "--endpoints", f"@{work / 'endpoints.yaml'}"]
        if self.settings.objectives:
            args += ["--objectives", str(work / "objectives.yaml")]
        if self.settings.epp_config is not None:
            args += ["--config-file", self.settings.epp_config]
        return args

    def endpoints_document(self) -> dict:
        """The model servers as the reference's file-discovery document."""
        entries = []
        roles = self.settings.roles
        for index, address in enumerate(self.endpoints):
            ip, port = parse_address(address)
            labels = {ENGINE_LABEL: self.settings.engine} if self.settings.label_engine else {}
            if roles and roles[index]:
                labels[ROLE_LABEL] = roles[index]
            entries.append({"name": address, "address": ip, "port": str(port), "labels": labels})
        return {"endpoints": entries}

    async def start_epp(self) -> Child:
        settings = self.settings
        argv = [
            "-m",
            "epp",
            "serve",
            "--grpc-port",
            str(self.epp_port),
            "--grpc-health-port",
            "0",
            "--metrics-port",
            str(settings.epp_metrics_port),
            "--bind-address",
            "127.0.0.1",
            "--refresh-metrics-interval",
            f"{settings.scrape_interval_s * 1000:g}ms",
            "--grace",
            f"{settings.epp_grace_s:g}s",
            "--log-level",
            "warning",
            *self._write_inputs(),
            *settings.epp_args,
        ]
        self.epp = await start_child("epp serve", argv, self.workdir)
        self._epp_stopped = False
        self.epp_port = int(self.epp.ready["grpc"])
        return self.epp

    async def stop_epp(self, kill: bool = False) -> None:
        if self.epp is not None:
            self._epp_stopped = True
            if kill:
                self.epp.kill()
            await self.epp.stop()

    async def restart_epp(self) -> Child:
        await self.stop_epp()
        return await self.start_epp()

    def epp_crashed(self) -> bool:
        """The EPP process is gone although nobody stopped it."""
        return self.epp is not None and not self.epp.alive and not self._epp_stopped

    @property
    def epp_metrics_url(self) -> str:
        assert self.epp is not None
        return f"http://127.0.0.1:{self.epp.ready['metrics']}/metrics"

    async def epp_metrics(self, session: aiohttp.ClientSession) -> EppMetricsView:
        async with session.get(self.epp_metrics_url) as response:
            return read_epp_metrics(await response.text())

    @property
    def epp_pid(self) -> int:
        assert self.epp is not None
        return self.epp.pid

    # -- stopping --------------------------------------------------------------------

    async def stop(self) -> None:
        # All at once: Envoy is already gone, so nothing depends on the order,
        # and a stop's grace is then paid once, not once per process.
        stops = [self.stop_epp(), *(child.stop() for child in self.server_processes)]
        if self.sidecars is not None:
            stops.append(self.sidecars.stop())
        await asyncio.gather(*stops)


@contextlib.asynccontextmanager
async def live_stack(settings: StackSettings) -> AsyncIterator[LiveStack]:
    workdir = Path(tempfile.mkdtemp(prefix="epp-live-"))
    stack = LiveStack(settings, workdir)
    try:
        await stack.start_servers()
        await stack.start_epp()
        async with running_envoy(
            stack.epp_port, template=settings.envoy_template, LISTEN_PORT=settings.envoy_listen_port
        ) as envoy:
            stack.envoy = envoy
            yield stack
    finally:
        stack.envoy = None
        await stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
