"""`tests.support.epp_process`: an `epp serve` subprocess leaves no working
directory behind, however it ends (the stray `/tmp/epp-test-*` directories
of earlier sessions)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from tests.conftest import left_behind
from tests.support.epp_process import running_epp, start_epp


def children() -> set[int]:
    """This process's child processes (Linux)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where `tempfile` makes directories during the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


async def test_a_stopped_epp_leaves_no_directory_and_keeps_its_log(temporary: Path) -> None:
    async with running_epp("--endpoints=127.0.0.1:9") as epp:
        assert left_behind(temporary) == [epp.workdir.name]

    assert left_behind(temporary) == []
    assert "epp serving" in epp.log()


async def test_a_terminated_epp_leaves_no_directory(temporary: Path) -> None:
    epp = await start_epp("--endpoints=127.0.0.1:9")

    assert await epp.terminate() == 0
    assert left_behind(temporary) == []


async def test_an_epp_that_cannot_start_leaves_no_directory(temporary: Path) -> None:
    with pytest.raises(RuntimeError, match="--workers -1"):
        await start_epp("--endpoints=127.0.0.1:9", "--workers=-1")

    assert left_behind(temporary) == []


async def test_an_epp_cancelled_while_starting_leaves_no_directory_or_process(
    temporary: Path,
) -> None:
    before = children()
    starting = asyncio.create_task(start_epp("--endpoints=127.0.0.1:9"))
    while children() == before:
        await asyncio.sleep(0.01)
    starting.cancel()

    with pytest.raises(asyncio.CancelledError):
        await starting
    assert left_behind(temporary) == []
    assert children() == before
