"""Logging of `epp serve` from the reference's logging flags: `-v`, and
controller-runtime's `--zap-encoder`, `--zap-log-level`, `--zap-devel`,
`--zap-time-encoding` (epp's own `--log-level` overrides both levels).

Console lines are `time LEVEL logger: message`; JSON lines carry zap's keys
(`level`, `ts`, `logger`, `msg`, and `error` with the traceback), so log
pipelines written for the reference keep parsing them.
"""

from __future__ import annotations

import datetime
import json
import logging

from epp.serve.options import ServeOptions

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


def configure(options: ServeOptions) -> None:
    handler = logging.StreamHandler()
    if json_lines(options):
        handler.setFormatter(JsonFormatter(options.zap_time_encoding or "epoch"))
    else:
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    logging.basicConfig(level=level_of(options), handlers=[handler], force=True)
