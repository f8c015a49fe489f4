"""`epp serve`: run the EPP (ext_proc for Envoy, gRPC health, Prometheus metrics).

Flag names follow the reference EPP where it has one. Durations are Go-style
("50ms", "10s"); see epp.serve.server for how the inputs are chosen.

epp.serve.server (gRPC, aiohttp, prometheus-client) is imported in `run`, not at
the top, so that the other subcommands start light.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from epp.config.units import parse_byte_size, parse_duration

if TYPE_CHECKING:
    from epp.serve.server import ServeOptions

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _size(text: str) -> int:
    try:
        return parse_byte_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ports = parser.add_argument_group("ports (0 picks a free port; the bound ports are logged)")
    ports.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC (default 9002)")
    ports.add_argument(
        "--grpc-health-port", type=int, default=9003, help="gRPC health (default 9003)"
    )
    ports.add_argument(
        "--metrics-port", type=int, default=9090, help="Prometheus /metrics (default 9090)"
    )
    ports.add_argument(
        "--bind-address", default="0.0.0.0", help="address of all listeners (default 0.0.0.0)"
    )
    ports.add_argument(
        "--ready-file", help="once serving, write the bound ports there as JSON (for scripts)"
    )

    inputs = parser.add_argument_group("inputs")
    inputs.add_argument(
        "--config-file", "--config", dest="config_file", help="EndpointPickerConfig YAML"
    )
    inputs.add_argument(
        "--objectives",
        nargs="+",
        default=[],
        metavar="PATH",
        help="InferenceObjective manifests (files or folders); default: the shipped samples",
    )
    inputs.add_argument("--pool", dest="pool_file", metavar="FILE", help="InferencePool manifest")
    inputs.add_argument(
        "--pool-name",
        help="the pool to serve; without --endpoints, read pool, objectives and pods from "
        "Kubernetes",
    )
    inputs.add_argument("--pool-namespace", default="default", help="(default: default)")
    inputs.add_argument(
        "--endpoints", metavar="LIST|@FILE", help="static endpoints: ip:port,... or @FILE"
    )
    inputs.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    inputs.add_argument(
        "--ha-enable-leader-election",
        action="store_true",
        help="only the holder of the pool's Lease writes objective status",
    )
    inputs.add_argument(
        "--file-watch-interval",
        type=_duration,
        default=1.0,
        help="how often input files are checked for changes (default 1s)",
    )

    serving = parser.add_argument_group("serving")
    serving.add_argument(
        "--refresh-metrics-interval",
        type=_duration,
        default=0.05,
        help="model-server metrics scrape interval (default 50ms)",
    )
    serving.add_argument(
        "--max-body-bytes",
        type=_size,
        default=16 * 1024 * 1024,
        help="larger request bodies get 413 (default 16Mi)",
    )
    serving.add_argument("--secure-serving", action="store_true", help="TLS on the ext_proc port")
    serving.add_argument("--cert-path", help="PEM certificate (default: self-signed at start)")
    serving.add_argument("--key-path", help="PEM private key, with --cert-path")
    serving.add_argument(
        "--grace",
        type=_duration,
        default=10.0,
        help="on SIGTERM, time for queued and running requests to finish (default 10s)",
    )
    serving.add_argument("--seed", type=int, help="seed of the scheduler's random choices")
    serving.add_argument(
        "--default-model",
        metavar="NAME",
        help="the model of a request without `model`, as vLLM serves it with its served "
        "model (default: such a request gets 400, as in the reference EPP)",
    )
    serving.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="(default info)",
    )


def options_from(args: argparse.Namespace) -> ServeOptions:
    from epp.serve.server import ServeOptions

    return ServeOptions(
        grpc_port=args.grpc_port,
        grpc_health_port=args.grpc_health_port,
        metrics_port=args.metrics_port,
        bind_address=args.bind_address,
        config_file=args.config_file,
        objectives=tuple(args.objectives),
        pool_file=args.pool_file,
        pool_name=args.pool_name,
        pool_namespace=args.pool_namespace,
        endpoints=args.endpoints,
        kubeconfig=args.kubeconfig,
        leader_election=args.ha_enable_leader_election,
        refresh_metrics_interval=args.refresh_metrics_interval,
        max_body_bytes=args.max_body_bytes,
        secure_serving=args.secure_serving,
        cert_path=args.cert_path,
        key_path=args.key_path,
        grace=args.grace,
        watch_interval=args.file_watch_interval,
        ready_file=args.ready_file,
        seed=args.seed,
        default_model=args.default_model,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    if (args.cert_path is None) != (args.key_path is None):
        logging.getLogger("epp.serve.server").error("--cert-path and --key-path go together")
        return 2
    from epp.serve.server import serve

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(serve(options_from(args)))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (a faster loop for the hot path),
    else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
