"""Logging of `epp serve` from the reference's logging flags: `-v`, and
controller-runtime's `--zap-encoder`, `--zap-log-level`, `--zap-devel`,
`--zap-time-encoding` (epp's own `--log-level` overrides both levels).

The level they give is that of epp's own loggers (`epp.*`). Every other
library stays at warning, or at epp's level when that is higher, since at
debug some write megabytes (cel-python its parse trees);
`--logger-levels NAME=LEVEL,...` sets any logger by name.

Console lines are `time LEVEL logger: message`; JSON lines carry zap's keys
(`level`, `ts`, `logger`, `msg`, and `error` with the traceback), so log
pipelines written for the reference keep parsing them.
"""

from __future__ import annotations

import datetime
import json
import logging

from epp.serve.options import ServeOptions

OWN_LOGGER = "epp"
"""The parent of epp's loggers (each module's is its `__name__`)."""
CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEBUG_VERBOSITY = 4
"""The reference's DEBUG verbosity (pkg/common/observability/logging)."""
ZAP_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "error": logging.ERROR,
    "panic": logging.CRITICAL,
}


def level_of(options: ServeOptions) -> int:
    if options.log_level is not None:
        return logging.getLevelNamesMapping()[options.log_level.upper()]
    if options.zap_log_level is not None:
        named = ZAP_LEVELS.get(options.zap_log_level)
        if named is not None:
            return named
        return logging.DEBUG if int(options.zap_log_level) >= DEBUG_VERBOSITY else logging.INFO
    return logging.DEBUG if options.v >= DEBUG_VERBOSITY else logging.INFO


def json_lines(options: ServeOptions) -> bool:
    if options.zap_encoder is not None:
        return options.zap_encoder == "json"
    return not options.zap_devel


def zap_time(seconds: float, encoding: str) -> float | int | str:
    """A record's time as zap's time encoders write it."""
    if encoding == "millis":
        return seconds * 1000
    if encoding == "nano":
        return int(seconds * 1e9)
    if encoding == "epoch":
        return seconds
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    if encoding == "iso8601":
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    if encoding == "rfc3339nano":
        return moment.isoformat().replace("+00:00", "Z")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class JsonFormatter(logging.Formatter):
    def __init__(self, time_encoding: str = "epoch") -> None:
        super().__init__()
        self.time_encoding = time_encoding

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "level": record.levelname.lower(),
            "ts": zap_time(record.created, self.time_encoding),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line)


def named_levels(options: ServeOptions) -> dict[str, int]:
    """The loggers `--logger-levels` names, with their levels (checked by
    `ServeOptions.problems`)."""
    names = logging.getLevelNamesMapping()
    return {
        name: names[level.upper()]
        for name, _, level in (item.partition("=") for item in options.logger_levels)
        if name and level.upper() in names
    }


def configure(options: ServeOptions) -> None:
    handler = logging.StreamHandler()
    if json_lines(options):
        handler.setFormatter(JsonFormatter(options.zap_time_encoding or "epoch"))
    else:
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    level = level_of(options)
    logging.basicConfig(level=max(level, logging.WARNING), handlers=[handler], force=True)
    logging.getLogger(OWN_LOGGER).setLevel(level)
    for name, named in named_levels(options).items():
        logging.getLogger(name).setLevel(named)
