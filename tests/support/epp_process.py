"""`epp serve` as a real subprocess on loopback, with free ports.

    async with running_epp("--endpoints", "127.0.0.1:8000") as epp:
        epp.ports["grpc"], epp.ports["grpc_health"], epp.ports["metrics"]

All ports are 0 (the EPP binds free ones) and read back from the JSON that
`--ready-file` gets once the EPP serves. Its drain window is 0 unless a
test gives `--drain-timeout`. On exit the EPP gets SIGTERM (killed after a
grace period). Its working directory (ready file, log) is a fresh
`/tmp/epp-test-*` that `terminate()` removes, also when it never became
ready; its log stays readable through `log()` afterwards.
`EPP_TEST_WORKERS=N` in the environment runs every EPP with `--workers N`
(the e2e suite against the core owner and its workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from epp.demo.processes import tied_to_parent

LOOPBACK = "127.0.0.1"
WORKERS = (
    (f"--workers={os.environ['EPP_TEST_WORKERS']}",) if os.environ.get("EPP_TEST_WORKERS") else ()
)


@dataclass(slots=True)
class RunningEpp:
    process: asyncio.subprocess.Process
    ports: dict[str, int]
    workdir: Path
    """Removed by `terminate()`."""
    final_log: str | None = None
    """The log as it was when `terminate()` removed the working directory."""

    def log(self) -> str:
        if self.final_log is not None:
            return self.final_log
        return (self.workdir / "epp.log").read_text(errors="replace")

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['metrics']}/metrics"

    async def queued(self, session: aiohttp.ClientSession) -> float:
        """Requests held in the EPP's queues, from its queue-size gauge."""
        async with session.get(self.metrics_url) as response:
            text = await response.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("llm_d_epp_flow_control_queue_size{")
        )

    async def wait_queued(
        self, session: aiohttp.ClientSession, count: int, timeout: float = 10.0
    ) -> None:
        """Until the EPP holds `count` requests queued; fails after `timeout` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.queued(session) != count:
            assert loop.time() < deadline, f"queue never reached {count}"
            await asyncio.sleep(0.02)

    async def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit code (killed if it takes longer than
        `timeout`); the working directory goes, its log is kept."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.final_log is None:
            try:
                self.final_log = self.log()
            except FileNotFoundError:
                self.final_log = ""
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.process.returncode


def objectives_yaml(pool: str, **priorities: int) -> str:
    """What `--objectives` reads: an InferenceObjective per name, at its priority, in `pool`."""
    return "---\n".join(
        f"""\
apiVersion: llm-d.ai/v1
kind: InferenceObjective
metadata: {{name: {name}, namespace: default}}
spec:
  priority: {priority}
  poolRefs: [{{name: {pool}}}]
"""
        for name, priority in priorities.items()
    )


async def start_epp(
    *args: str,
    ready_timeout: float = 30.0,
    env: dict[str, str] | None = None,
    module: str = "epp",
) -> RunningEpp:
    """`epp serve` with free ports and `args`; `env` adds to the environment;
    `module` is what `python -m` runs (one with epp's command line)."""
    workdir = Path(tempfile.mkdtemp(prefix="epp-test-"))
    ready = workdir / "ready.json"
    try:
        with (workdir / "epp.log").open("wb") as log:
            argv = [
                sys.executable,
                "-m",
                module,
                "serve",
                "--grpc-port=0",
                "--grpc-health-port=0",
                "--metrics-port=0",
                f"--bind-address={LOOPBACK}",
                f"--ready-file={ready}",
                "--drain-timeout=0s",  # a test that drains gives its own window
                *WORKERS,
                *args,
            ]
            process = await asyncio.create_subprocess_exec(
                *tied_to_parent(argv),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    epp = RunningEpp(process, {}, workdir)
    try:
        epp.ports = await _ready_ports(epp, ready, ready_timeout)
    except BaseException:
        await epp.terminate()
        raise
    return epp


async def _ready_ports(epp: RunningEpp, ready: Path, timeout: float) -> dict[str, int]:
    """The ports in the ready file once the EPP wrote it; a RuntimeError with
    its log when it exits first or takes longer than `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready.exists():
        if epp.process.returncode is not None or loop.time() > deadline:
            raise RuntimeError(
                f"epp serve did not start (exit {epp.process.returncode}):\n{epp.log()}"
            )
        await asyncio.sleep(0.05)
    return json.loads(ready.read_text())


@contextlib.asynccontextmanager
async def running_epp(
    *args: str, ready_timeout: float = 30.0, env: dict[str, str] | None = None
) -> AsyncIterator[RunningEpp]:
    epp = await start_epp(*args, ready_timeout=ready_timeout, env=env)
    try:
        yield epp
    finally:
        await epp.terminate()
