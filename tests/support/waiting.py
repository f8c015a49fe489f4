"""Waiting in async tests for something another task or process brings about."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until `condition()` holds; fail the test after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"condition not met within {timeout} s"
        await asyncio.sleep(0.01)
