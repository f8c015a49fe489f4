"""Reload input files when they change, by polling their modification times.

Each watched group (objectives, pool, config, endpoints) names its paths
(files or folders) and a `reload` callable. Every `interval` seconds the
watcher takes a fingerprint of each group (for a file its mtime and size; for
a folder, the same for each manifest file in it, so added and removed files
count); when it differs from the last one, `reload` runs. A `reload` that
raises refused the change: the error is logged with the group's name and
the caller keeps its last good state. The new fingerprint is remembered
either way, so a bad file is reported once, not at every poll; fixing it
changes the fingerprint again.

Polling, not inotify: it works the same on ConfigMap volumes (whose files
are swapped through symlinks) and costs a few stat calls per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epp.api.manifests import MANIFEST_SUFFIXES

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(paths: Sequence[str | Path]) -> Fingerprint:
    """(path, mtime in ns, size) of every file `paths` name, folders expanded
    to their manifest files; a missing path appears with -1s."""
    entries: list[tuple[str, int, int]] = []
    for path in map(Path, paths):
        if path.is_dir():
            with contextlib.suppress(OSError):
                for child in sorted(path.iterdir()):
                    if child.suffix in MANIFEST_SUFFIXES:
                        entries.append(_stat(child))
        else:
            entries.append(_stat(path))
    return tuple(entries)


def _stat(path: Path) -> tuple[str, int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (str(path), -1, -1)
    return (str(path), stat.st_mtime_ns, stat.st_size)


@dataclass(slots=True)
class _Group:
    name: str
    paths: tuple[str, ...]
    reload: Callable[[], None]
    last: Fingerprint = field(default_factory=tuple)


class FileWatcher:
    """See the module docstring. `watch` the groups, then `start()`/`stop()`."""

    def __init__(self, interval: float = 1.0) -> None:
        if interval <= 0:
            raise ValueError(f"the watch interval must be positive, got {interval}")
        self.interval = interval
        self._groups: list[_Group] = []
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0
        self.refusals = 0

    def watch(self, name: str, paths: Sequence[str | Path], reload: Callable[[], None]) -> None:
        """Call `reload` whenever a file of `paths` changes (their state now
        counts as already loaded)."""
        group = _Group(name, tuple(map(str, paths)), reload)
        group.last = fingerprint(group.paths)
        self._groups.append(group)

    def check(self) -> None:
        """Look once; reload the groups that changed."""
        for group in self._groups:
            current = fingerprint(group.paths)
            if current == group.last:
                continue
            group.last = current
            try:
                group.reload()
            except Exception as error:
                self.refusals += 1
                log.error(
                    "refused the change to %s (%s); keeping the last good state:\n%s",
                    group.name,
                    ", ".join(group.paths),
                    error,
                )
            else:
                self.reloads += 1
                log.info("reloaded %s from %s", group.name, ", ".join(group.paths))

    def start(self) -> None:
        if self._task is None and self._groups:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="file watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
