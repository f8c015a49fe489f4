"""`epp serve`'s flags: one table (ServeOptions) gives the parser, the help
and the options object; the reference runner's flags and defaults."""

from __future__ import annotations

import argparse
import json
import logging

import pytest

from epp.serve import logs
from epp.serve.options import Group, ServeOptions, add_arguments, flags, given_options

REFERENCE_FLAGS = (
    "--pool-name", "--pool-namespace", "--pool-group", "--endpoint-selector",
    "--endpoint-target-ports", "--config-file", "--config-text", "--grpc-port",
    "--grpc-health-port", "--metrics-port", "--metrics-endpoint-auth", "--secure-serving",
    "--cert-path", "--enable-cert-reload", "--tls-min-version", "--tls-cipher-suites",
    "--ha-enable-leader-election", "--refresh-metrics-interval",
    "--refresh-prometheus-metrics-interval", "--metrics-staleness-threshold",
    "--total-queued-requests-metric", "--total-running-requests-metric",
    "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric",
    "--grpc-max-recv-msg-size", "--grpc-max-send-msg-size", "--drain-timeout",
    "--health-checking", "--allow-experimental-plugins", "--disable-endpoint-subset-filter",
    "--tracing", "--enable-pprof", "-v", "--v", "--zap-devel", "--zap-encoder",
    "--zap-log-level", "--zap-stacktrace-level", "--zap-time-encoding",
)  # fmt: skip
"""The flags issue #14 lists (llm-d-router pkg/epp/server/options.go, its
logging options, controller-runtime's zap flags)."""


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="epp serve")
    add_arguments(result)
    return result


def parse(*argv: str) -> tuple[ServeOptions, dict]:
    given = given_options(parser().parse_args(argv))
    return ServeOptions(**given), given


def test_every_flag_of_the_reference_runner_is_an_option():
    known = {name for action in parser()._actions for name in action.option_strings}
    assert set(REFERENCE_FLAGS) - known == set()


def test_defaults_are_the_reference_runners_and_secure():
    options, given = parse()
    assert given == {}
    assert options.secure_serving and options.metrics_endpoint_auth
    assert (options.grpc_port, options.grpc_health_port, options.metrics_port) == (
        9002,
        9003,
        9090,
    )
    assert options.drain_timeout == 30.0
    assert options.refresh_metrics_interval == 0.05
    assert options.metrics_staleness_threshold == 2.0
    assert options.pool_group == "inference.networking.k8s.io"
    assert options.v == 2


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--secure-serving=false"], False),
        (["--secure-serving", "false"], False),
        (["--secure-serving"], True),
        (["--secure-serving=true"], True),
    ],
)
def test_a_boolean_flag_is_written_as_pflag_writes_it(argv, expected):
    assert parse(*argv)[0].secure_serving is expected


@pytest.mark.parametrize("argv", [["-v", "5"], ["-v5"], ["--v=5"], ["-v=5"]])
def test_verbosity_is_read_in_every_spelling(argv):
    assert parse(*argv)[0].v == 5


def test_values_are_parsed_by_kind():
    options, _ = parse(
        "--drain-timeout=1m30s",
        "--grpc-max-recv-msg-size=10MiB",
        "--grpc-max-send-msg-size=25MB",
        "--endpoint-target-ports=8000,8001,8000",
        "--tls-cipher-suites=TLS_A, TLS_B",
    )
    assert options.drain_timeout == 90.0
    assert options.grpc_max_recv_msg_size == 10 * 1024 * 1024
    assert options.grpc_max_send_msg_size == 25_000_000
    assert options.endpoint_target_ports == (8000, 8001)
    assert options.tls_cipher_suites == ("TLS_A", "TLS_B")


def test_a_bad_value_is_refused_with_the_flags_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse("--drain-timeout=soon")
    assert exit_.value.code == 2
    assert "--drain-timeout" in capsys.readouterr().err


def test_help_groups_the_flags_as_the_reference_runner_does(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    text = capsys.readouterr().out
    positions = [text.index(f"\n{group.value}:\n") for group in Group]
    assert positions == sorted(positions)
    assert positions[0] < text.index("\n  --grpc-port") < positions[1]
    pool_section = text[positions[1] : positions[2]]
    assert "--pool-group" in pool_section and "--endpoint-selector" not in pool_section


def test_help_shows_each_default_once():
    help_texts = [action.help for action in parser()._actions if action.dest == "drain_timeout"]
    assert help_texts[0].count("(default 30s)") == 1


def test_every_option_has_a_group_and_help():
    for name, flag in flags():
        assert flag.help and isinstance(flag.group, Group), name


def test_a_flag_without_meaning_gives_one_warning_when_given():
    options, given = parse("--enable-pprof=true", "--tracing=true", "--pool-name=p")
    warnings = options.inert_warnings(given)
    assert len(warnings) == 2
    assert warnings[0].startswith("--tracing=true has no effect in epp")
    assert warnings[1].startswith("--enable-pprof=true has no effect in epp")


def test_a_flag_given_with_the_value_epp_honours_is_not_warned_about():
    options, given = parse("--tracing=false", "--enable-pprof=false", "--health-checking")
    assert options.inert_warnings(given) == []


def test_flags_left_at_their_defaults_are_not_warned_about():
    options, given = parse()
    assert options.inert_warnings(given) == []


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--pool-name=p", "--endpoint-selector=app=x", "--endpoint-target-ports=1"], "both"),
        (["--endpoint-selector=app=x"], "1 to 8 ports"),
        (["--endpoint-selector=app=x", "--endpoint-target-ports=1,2,3,4,5,6,7,8,9"], "1 to 8"),
        (["--config-file=a", "--config-text=b"], "--config-text"),
        (["--pool-group=inference.networking.x-k8s.io"], "only"),
        (["--zap-log-level=loud"], "--zap-log-level"),
        (["--enable-cert-reload"], "--cert-path"),
    ],
)
def test_options_that_cannot_work_together_are_named(argv, problem):
    problems = parse(*argv)[0].problems()
    assert len(problems) == 1 and problem in problems[0]


def test_the_namespace_defaults_to_the_pods_namespace(monkeypatch):
    monkeypatch.setenv("NAMESPACE", "inference")
    assert parse()[0].namespace == "inference"
    assert parse("--pool-namespace=other")[0].namespace == "other"
    monkeypatch.delenv("NAMESPACE")
    assert parse()[0].namespace == "default"


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        ([], logging.INFO),
        (["-v", "4"], logging.DEBUG),
        (["--zap-log-level=debug"], logging.DEBUG),
        (["--zap-log-level=error", "-v", "5"], logging.ERROR),
        (["--zap-log-level=5"], logging.DEBUG),
        (["--log-level=warning", "--zap-log-level=debug"], logging.WARNING),
    ],
)
def test_the_log_level_follows_v_then_zap_then_log_level(argv, level):
    assert logs.level_of(parse(*argv)[0]) == level


def test_zap_encoder_json_gives_zap_keyed_json_lines():
    options, _ = parse("--zap-encoder=json", "--zap-time-encoding=millis")
    assert logs.json_lines(options)
    record = logging.LogRecord("epp.x", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    record.created = 2.5
    line = json.loads(logs.JsonFormatter(options.zap_time_encoding).format(record))
    assert line == {"level": "warning", "ts": 2500.0, "logger": "epp.x", "msg": "a b"}


def test_console_lines_unless_zap_devel_is_off_or_json_is_asked():
    assert not logs.json_lines(parse()[0])
    assert logs.json_lines(parse("--zap-devel=false")[0])
    assert not logs.json_lines(parse("--zap-devel=false", "--zap-encoder=console")[0])
