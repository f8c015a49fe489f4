"""What every test run holds to: a test removes the temporary directories
it makes.

The support helpers make theirs with `tempfile` (`epp-test-*` for an
`epp serve` subprocess, `epp-envoy-*` for an Envoy, `epp-live-*` for a
demo stack). For the session they are made in one directory of pytest's
own; when the session ends it must hold none of them, and the error names
what was left (each one's `epp.log` says which test made it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LEFT_BEHIND = "epp-"


def left_behind(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir() if entry.name.startswith(LEFT_BEHIND))


@pytest.fixture(scope="session", autouse=True)
def temporary_directories_are_removed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("tempfile")
    saved, tempfile.tempdir = tempfile.tempdir, str(directory)
    try:
        yield directory
    finally:
        tempfile.tempdir = saved
    left = left_behind(directory)
    assert not left, f"temporary directories the tests left behind in {directory}: {left}"
