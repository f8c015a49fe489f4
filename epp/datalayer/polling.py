"""One asyncio task per endpoint of the store, for what reads every model
server on its own period (the metrics scraper, the model-list reader).

`EndpointPolls` starts a task as an endpoint joins the store that calls
`read(address)` every `interval()` seconds (start to start; a read that
takes longer is followed at once) and cancels it as the endpoint leaves;
`after_change` runs after each change was followed (a reader drops what it
kept for the endpoints that left).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from epp.datalayer.store import EndpointStore


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task, then wait for each to end, its cancellation
    swallowed (how the live shell stops its background tasks)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass(slots=True, eq=False)
class EndpointPolls:
    """The per-endpoint tasks (see the module docstring)."""

    store: EndpointStore
    read: Callable[[str], Awaitable[None]]
    interval: Callable[[], float]
    """Read on each period, so that a changed interval applies from the next one."""
    label: str
    after_change: Callable[[], None] | None = None
    running: bool = field(default=False, init=False)
    """Between `start` and `stop`."""
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False, repr=False)

    def start(self) -> None:
        """Poll every endpoint, and each one that joins; call on the event loop."""
        if self.running:
            return
        self.running = True
        self.store.on_membership_change(self._follow)
        self._follow()

    async def stop(self) -> None:
        """Cancel every poll and wait for them to end."""
        self.running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        await cancel_and_wait(tasks)

    def _follow(self) -> None:
        if not self.running:
            return
        current = set(self.store.addresses())
        for address in list(self._tasks):
            if address not in current:
                self._tasks.pop(address).cancel()
        loop = asyncio.get_running_loop()
        for address in current:
            if address not in self._tasks:
                self._tasks[address] = loop.create_task(
                    self._poll(address), name=f"{self.label} {address}"
                )
        if self.after_change is not None:
            self.after_change()

    async def _poll(self, address: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.read(address)
            await asyncio.sleep(max(0.0, self.interval() - (loop.time() - started)))
