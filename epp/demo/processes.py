"""Child processes of the live demo: started, waited for, and always stopped.

A child announces it is up by writing a JSON ready file (the ports it bound).
If it exits first, or does not announce in time, `PartFailed` names the part
and carries the tail of its log. Stopping is SIGTERM, then SIGKILL after a
grace period. Every child is tied to its parent (`tied_to_parent`): a
parent killed with SIGKILL leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class PartFailed(RuntimeError):
    """One part of the live stack did not start or died; the message says which and why."""

    def __init__(self, part: str, reason: str) -> None:
        super().__init__(f"{part}: {reason}")
        self.part = part
        self.reason = reason


def log_tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "\n".join(text)


# Linux keeps the parent-death signal across exec, so a launcher sets it and
# then becomes the real program; the ppid check covers a parent that died first.
_LIFELINE = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0):
    sys.exit("prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def tied_to_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when this process dies, however it
    dies (Linux's PR_SET_PDEATHSIG); elsewhere `argv` as it is."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-S", "-c", _LIFELINE, str(os.getpid()), *argv]


class Part(Protocol):
    """A server a child process runs: started on a free port, stopped at the end."""

    async def start(self) -> int: ...

    async def stop(self) -> None: ...


async def serve_until_signalled(parts: Sequence[Part], ready_file: str | None) -> None:
    """The child's side of the ready-file protocol: start `parts`, announce
    their ports atomically in `ready_file` (if given), and serve until
    SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        ports = [await part.start() for part in parts]
        if ready_file is not None:
            path = Path(ready_file)
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(json.dumps({"ports": ports, "pid": os.getpid()}))
            temporary.replace(path)
        await stop.wait()
    finally:
        for part in parts:
            await part.stop()


@dataclass(slots=True)
class Child:
    """A running child process and what it announced."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    ready: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive:
            self.process.kill()

    async def stop(self, grace: float = 5.0) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace)
            except TimeoutError:
                self.kill()
        await self.process.wait()


async def wait_ready_file(
    name: str,
    process: asyncio.subprocess.Process,
    ready_file: Path,
    log_path: Path,
    timeout: float,
) -> dict[str, Any]:
    """The JSON the child writes once it is up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if ready_file.exists():
            return json.loads(ready_file.read_text())
        if process.returncode is not None:
            raise PartFailed(
                name, f"exited with status {process.returncode}\n{log_tail(log_path)}".rstrip()
            )
        await asyncio.sleep(0.05)
    raise PartFailed(name, f"not ready after {timeout:.0f} s\n{log_tail(log_path)}".rstrip())


async def start_child(
    name: str,
    argv: Sequence[str],
    workdir: Path,
    timeout: float = 30.0,
    ready_flag: str = "--ready-file",
) -> Child:
    """Run `python -m ...argv` (argv starts after the interpreter) with
    `ready_flag FILE` appended; its stdout and stderr go to `workdir/NAME.log`."""
    slug = name.replace(" ", "-")
    ready_file = workdir / f"{slug}.ready.json"
    log_path = workdir / f"{slug}.log"
    ready_file.unlink(missing_ok=True)
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *tied_to_parent([sys.executable, *argv, ready_flag, os.fspath(ready_file)]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        ready = await wait_ready_file(name, process, ready_file, log_path, timeout)
    except BaseException:
        await Child(name, process, log_path, {}).stop(grace=2.0)
        raise
    return Child(name, process, log_path, ready)


@contextlib.asynccontextmanager
async def child(
    name: str, argv: Sequence[str], workdir: Path, timeout: float = 30.0
) -> AsyncIterator[Child]:
    started = await start_child(name, argv, workdir, timeout)
    try:
        yield started
    finally:
        await started.stop()
