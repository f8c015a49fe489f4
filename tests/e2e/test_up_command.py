"""`epp up`: the stack comes up and serves through Envoy with the commands
it prints, and Ctrl-C stops every process it started."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.envoy]


def children(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def printed_block(output: str, first: str, last: str) -> str:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i, line in enumerate(lines) if i > start and last in line)
    return "\n".join(lines[start + 1 : end + 1])


async def test_epp_up_serves_the_printed_requests_in_30_s_and_ctrl_c_leaves_no_process():
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "epp",
        "up",
        "--port=0",
        "--metrics-port=0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen = ""
    while "Ctrl-C stops everything" not in seen:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line, seen
        seen += line.decode()
    curl = printed_block(seen, "try it:", "-d '").replace("\\\n", " ")
    sdk = "\n".join(
        line.removeprefix("  ") for line in printed_block(seen, "OpenAI SDK", "print(").splitlines()
    )
    answer = subprocess.run(["sh", "-c", curl + " -w ' %{http_code}'"], capture_output=True)
    assert answer.stdout.decode().endswith(" 200"), answer
    assert time.monotonic() - started < 30
    reply = subprocess.run([sys.executable, "-c", sdk], capture_output=True, timeout=30)
    assert reply.returncode == 0 and reply.stdout.strip(), reply
    metrics = re.search(r"^metrics: (\S+)$", seen, re.MULTILINE).group(1)
    page = subprocess.run(["curl", "-s", metrics], capture_output=True).stdout.decode()
    assert "llm_d_epp_request_total" in page or "inference_objective_request_total" in page
    started_processes = children(process.pid)
    assert len(started_processes) >= 3  # model servers, epp serve, envoy
    process.send_signal(signal.SIGINT)
    rest, _ = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0, rest.decode()
    assert "stopped everything it started" in rest.decode()
    assert [pid for pid in started_processes if alive(pid)] == []
