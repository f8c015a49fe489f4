"""`epp serve`'s log levels: -v and the level flags set epp's own loggers;
other libraries stay at warning unless `--logger-levels` names them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from epp.api.cel import evaluate
from epp.serve import logs
from tests.unit.serve.test_serve_options import parse


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def names(self) -> set[str]:
        return {record.name.split(".")[0] for record in self.records}


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    touched = ("epp", "celpy")
    levels = {name: logging.getLogger(name).level for name in touched}
    handler = Recorder()
    yield handler
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def configure(recorder: Recorder, *argv: str) -> None:
    logs.configure(parse(*argv)[0])
    logging.getLogger().addHandler(recorder)


def log_from_epp_and_cel(expression: str) -> None:
    logging.getLogger("epp.serve.test").debug("epp's own debug line")
    assert evaluate(expression, {"a": [1, 2]}) is not None  # cel-python logs as it compiles


def test_v4_gives_epp_debug_lines_and_not_cel_pythons(recorder):
    configure(recorder, "-v", "4")
    log_from_epp_and_cel("size(self.a) == 2 && self.a[0] == 1")
    assert recorder.names() == {"epp"}


def test_a_library_named_in_logger_levels_logs_at_that_level(recorder):
    configure(recorder, "-v", "4", "--logger-levels=celpy=debug")
    log_from_epp_and_cel("size(self.a) == 2 && self.a[1] == 2")
    assert recorder.names() == {"epp", "celpy"}


def test_libraries_log_warnings_and_epp_info_by_default(recorder):
    configure(recorder)
    assert logging.getLogger("epp.x").getEffectiveLevel() == logging.INFO
    assert logging.getLogger("aiohttp.access").getEffectiveLevel() == logging.WARNING


def test_an_epp_level_above_warning_quiets_the_libraries_too(recorder):
    configure(recorder, "--log-level=error")
    assert logging.getLogger("aiohttp.access").getEffectiveLevel() == logging.ERROR


def test_a_logger_level_without_a_known_level_is_refused_by_name():
    problems = parse("--logger-levels=celpy=loud,aiohttp")[0].problems()
    assert [p.split(":")[0] for p in problems] == [
        "--logger-levels 'celpy=loud'",
        "--logger-levels 'aiohttp'",
    ]
