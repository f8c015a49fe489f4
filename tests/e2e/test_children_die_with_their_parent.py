"""A process the EPP's tools start dies with the process that started it,
however that one dies: a killed test run or demo leaves no Envoy or server
behind (epp.demo.processes.tied_to_parent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SLEEPER = """
import asyncio, sys
from epp.demo.processes import tied_to_parent

async def main():
    child = await asyncio.create_subprocess_exec(
        *tied_to_parent([sys.executable, "-c", "import time; time.sleep(60)"]))
    print(child.pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""

ENVOY = """
import asyncio, sys
from epp.demo.envoy_process import running_envoy

async def main():
    async with running_envoy(epp_port=int(sys.argv[1])) as envoy:
        print(envoy.process.pid, flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_parent_and_watch(script: str, *args: str, timeout: float = 30.0) -> int:
    """Starts `script`, reads the pid of the child it prints, kills the
    script with SIGKILL and returns that child's pid once the kill is done."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent printed {line!r}"
        child = int(line)
        assert alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout)
    return child


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)  # the test's own cleanup: nothing left behind
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_tied_child_ends_when_its_parent_is_killed() -> None:
    child = kill_parent_and_watch(SLEEPER)
    assert gone_within(child, 5.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_envoy_ends_when_the_process_that_started_it_is_killed() -> None:
    # nothing listens on the EPP port: Envoy is ready without its ext_proc cluster
    envoy = kill_parent_and_watch(ENVOY, "9")
    assert gone_within(envoy, 10.0)
