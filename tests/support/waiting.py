"""Waiting in async tests for something another task or process brings about."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until `condition()` holds; fail the test after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"condition not met within {timeout} s"
        await asyncio.sleep(0.01)


def gone(pid: int) -> bool:
    """Whether no process `pid` exists any more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def eventually_gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether process `pid` is gone within `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not gone(pid):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
