"""Virtual time for tasks that take their clock and sleep as arguments.

Time moves only when every participant is asleep, and then straight to the
earliest wake-up, so a test measures durations exactly however slow the
machine is, and what it checks between steps sees every state the tasks pass
through. The tasks may do real I/O between sleeps (a participant that is not
asleep is waited for in real time).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class VirtualTime:
    """`clock` and `sleep` for the participants; `participants()` counts
    the ones still running (each sleeps on this clock between its steps)."""

    def __init__(self, participants: Callable[[], int], real_timeout: float = 10.0) -> None:
        self.now = 0.0
        self._participants = participants
        self._real_timeout = real_timeout
        self._wakeups: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        wakeup = asyncio.get_running_loop().create_future()
        heapq.heappush(self._wakeups, (self.now + delay, next(self._order), wakeup))
        await wakeup

    async def run_until(
        self,
        condition: Callable[[], bool],
        within: float,
        between_steps: Callable[[], None] | None = None,
    ) -> float:
        """Move time until `condition()` holds, calling `between_steps()`
        whenever every participant is asleep; the virtual seconds it took.
        Fails if that would take more than `within` virtual seconds."""
        start = self.now
        while True:
            await self._all_asleep()
            if between_steps is not None:
                between_steps()
            if condition():
                return self.now - start
            when, _, wakeup = heapq.heappop(self._wakeups)
            assert when - start <= within, f"condition not met within {within} virtual s"
            self.now = max(self.now, when)
            wakeup.set_result(None)

    async def _all_asleep(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._real_timeout
        while True:
            self._wakeups = [entry for entry in self._wakeups if not entry[2].done()]
            heapq.heapify(self._wakeups)
            if len(self._wakeups) >= self._participants():
                return
            assert loop.time() < deadline, "a participant did not go back to sleep"
            await asyncio.sleep(0.001)
