"""`epp serve`'s transport flags: one per TransportLimits field, into ServeOptions."""

from __future__ import annotations

import argparse

from epp.serve.options import add_arguments, options_from
from epp.transport import TransportLimits


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_without_transport_flags_the_limits_are_the_defaults():
    assert options_from(parsed()).transport == TransportLimits()


def test_transport_flags_take_counts_sizes_durations_and_ratios():
    limits = options_from(
        parsed(
            "--grpc-max-concurrent-streams",
            "100",
            "--grpc-connection-buffer-bytes",
            "2Mi",
            "--grpc-idle-timeout",
            "5m",
            "--grpc-premature-reset-ratio",
            "0.25",
        )
    ).transport
    assert limits.max_concurrent_streams == 100
    assert limits.connection_buffer_bytes == 2 * 1024 * 1024
    assert limits.idle_timeout == 300.0
    assert limits.premature_reset_ratio == 0.25
