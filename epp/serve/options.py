"""The options of `epp serve`, defined once.

`ServeOptions` is the table: each field is one flag, with its type, default,
group, help and, for a flag that means nothing here, why. From it come the
argparse parser (`add_arguments`), `epp serve --help` (grouped as the
reference runner's options are: ext_proc, InferencePool, endpoints,
model-server metrics scraping, diagnostics, configuration; then the flags only
`epp` has), and the options object (`options_from`).

Flag names, defaults and help follow the reference EPP
(llm-d-router `pkg/epp/server/options.go`, its logging options, and
controller-runtime's `--zap-*` flags). A flag without meaning here is
accepted, and `inert_warnings` gives one line for each one given with a value
that would ask for something `epp` does not do.

This module imports nothing heavy: `epp serve --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.serve.flags import (
    NOT_SET,
    Flag,
    Group,
    Kind,
    add_table_arguments,
    flag_name,
    given_values,
    option,
    shown,
    table_flags,
)
from epp.transport.limits import TransportLimits

MAX_WORKERS = 64
"""The most protocol worker processes `--workers` starts."""

POOL_GROUP = "inference.networking.k8s.io"
DEFAULT_NAMESPACE = "default"
TLS_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")
ZAP_LEVELS = ("debug", "info", "error", "panic")
LOGGER_LEVELS = ("debug", "info", "warning", "error", "critical")
ZAP_TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")
ENGINE_METRICS_FLAG = (
    "deprecated in the reference (which refuses it); model-server metric names "
    "come from the engine of each pod"
)


_X = Group.EXT_PROC
_P = Group.POOL
_E = Group.ENDPOINTS
_S = Group.SCRAPING
_D = Group.DIAGNOSTICS
_C = Group.CONFIGURATION
_O = Group.EPP


@dataclass(slots=True, frozen=True)
class ServeOptions:
    """Everything `epp serve` is told; each field is one flag (see the module
    docstring). Durations are seconds, sizes bytes."""

    # -- ext_proc -----------------------------------------------------------------
    grpc_port: int = option(
        9002, Flag(_X, "gRPC port used for communicating with Envoy proxy.", Kind.INT)
    )
    ha_enable_leader_election: bool = option(
        False,
        Flag(
            _X,
            "Enables leader election for high availability: readiness passes only on the "
            "holder of the pool's Lease, which alone writes objective status.",
            Kind.BOOL,
        ),
    )
    drain_timeout: float = option(
        30.0,
        Flag(
            _X,
            "Graceful shutdown drain window: on SIGTERM readiness goes NOT_SERVING and for "
            "this long the ext_proc port keeps accepting (a gateway answers 500 for a refused "
            "connection): new requests get 503 rejected-shutting-down, queued and running "
            "requests finish; then what is left is ended and the process exits. A second "
            "signal ends the window at once; 0 stops at once.",
            Kind.DURATION,
            names=("--drain-timeout", "--grace"),
        ),
    )
    grpc_max_recv_msg_size: int | None = option(
        None,
        Flag(
            _X,
            "Maximum size of a gRPC message to receive (e.g. 10MiB, 25MB); default: 4 MiB, "
            "grpc-go's (Envoy streams bodies in small chunks).",
            Kind.SIZE,
        ),
    )
    grpc_max_send_msg_size: int | None = option(
        None,
        Flag(
            _X,
            "Maximum size of a gRPC message to send (e.g. 10MiB, 25MB); default: 2 GiB, "
            "grpc-go's (epp sends bodies in chunks of at most 62,000 bytes).",
            Kind.SIZE,
        ),
    )

    # -- InferencePool ----------------------------------------------------------------
    pool_group: str = option(
        POOL_GROUP,
        Flag(
            _P,
            f"Kubernetes resource group of the InferencePool; only {POOL_GROUP} (v1) is supported.",
            Kind.TEXT,
        ),
    )
    pool_namespace: str = option(
        "",
        Flag(
            _P,
            "Namespace of the InferencePool (and of the pods and objectives).",
            Kind.TEXT,
            default_text="$NAMESPACE, else default",
        ),
    )
    pool_name: str | None = option(
        None,
        Flag(
            _P,
            "Name of the InferencePool. Without --endpoints: read the pool, its pods and "
            "the namespace's InferenceObjectives from Kubernetes.",
            Kind.TEXT,
        ),
    )

    # -- endpoints ----------------------------------------------------------------------
    endpoint_selector: str | None = option(
        None,
        Flag(
            _E,
            "Selector of the model server pods, in lieu of an InferencePool (Kubernetes "
            "label selector syntax: 'app=vllm,env=prod', 'env in (prod,staging)', 'key', "
            "'!deprecated'). Pods are read from Kubernetes; no InferenceObjectives.",
            Kind.TEXT,
        ),
    )
    endpoint_target_ports: tuple[int, ...] = option(
        (),
        Flag(
            _E,
            "Target ports of the model server pods, with --endpoint-selector: a "
            "comma-separated list (e.g. '3000,3001'), 1 to 8 ports.",
            Kind.INT_LIST,
        ),
    )
    disable_endpoint_subset_filter: bool = option(
        False,
        Flag(
            _E,
            "Ignore the destination endpoint subset Envoy sends in the request metadata.",
            Kind.BOOL,
        ),
    )
    emit_endpoint_scores: bool = option(
        False,
        Flag(
            _E,
            "Emit the scheduler's per-endpoint scores in the request's dynamic metadata.",
            Kind.BOOL,
            no_effect="epp does not emit per-endpoint scores",
            inert_value=False,
        ),
    )

    # -- model-server metrics scraping ----------------------------------------------------
    refresh_metrics_interval: float = option(
        0.05, Flag(_S, "Interval to refresh model-server metrics.", Kind.DURATION)
    )
    refresh_prometheus_metrics_interval: float = option(
        5.0,
        Flag(
            _S,
            "Interval to flush the pool's Prometheus gauges.",
            Kind.DURATION,
            no_effect="epp computes the pool gauges at each scrape of /metrics",
        ),
    )
    metrics_staleness_threshold: float = option(
        2.0,
        Flag(
            _S,
            "Age after which an endpoint's metrics are stale: stale endpoints are left out "
            "of the pool gauges.",
            Kind.DURATION,
        ),
    )
    total_queued_requests_metric: str = option(
        "vllm:num_requests_waiting",
        Flag(_S, "Prometheus metric for the number of queued requests.", Kind.TEXT,
             no_effect=ENGINE_METRICS_FLAG),
    )  # fmt: skip
    total_running_requests_metric: str = option(
        "vllm:num_requests_running",
        Flag(_S, "Prometheus metric for the number of running requests.", Kind.TEXT,
             no_effect=ENGINE_METRICS_FLAG),
    )  # fmt: skip
    kv_cache_usage_percentage_metric: str = option(
        "vllm:kv_cache_usage_perc",
        Flag(_S, "Prometheus metric for the fraction of KV-cache blocks in use.", Kind.TEXT,
             no_effect=ENGINE_METRICS_FLAG),
    )  # fmt: skip
    lora_info_metric: str = option(
        "vllm:lora_requests_info",
        Flag(_S, "Prometheus metric for the LoRA info metrics.", Kind.TEXT,
             no_effect=ENGINE_METRICS_FLAG),
    )  # fmt: skip
    cache_info_metric: str = option(
        "vllm:cache_config_info",
        Flag(_S, "Prometheus metric for the cache info metrics.", Kind.TEXT,
             no_effect=ENGINE_METRICS_FLAG),
    )  # fmt: skip

    # -- diagnostics ------------------------------------------------------------------------
    v: int = option(
        2,
        Flag(
            _D,
            "Log verbosity: 4 and above log debug lines.",
            Kind.INT,
            names=("-v", "--v"),
        ),
    )
    zap_devel: bool = option(
        True,
        Flag(
            _D,
            "Development mode: console log lines unless --zap-encoder says otherwise; "
            "false: JSON lines.",
            Kind.BOOL,
        ),
    )
    zap_encoder: str | None = option(
        None,
        Flag(
            _D,
            "Log encoding; default: console with --zap-devel, else json.",
            Kind.TEXT,
            choices=("json", "console"),
        ),
    )
    zap_log_level: str | None = option(
        None,
        Flag(
            _D,
            "Log level: debug, info, error, panic, or an integer verbosity (4 and above: "
            "debug); overrides -v.",
            Kind.TEXT,
        ),
    )
    zap_stacktrace_level: str | None = option(
        None,
        Flag(
            _D,
            "Level at and above which stack traces are captured.",
            Kind.TEXT,
            choices=("info", "error", "panic"),
            no_effect="epp logs a traceback with each error that has one",
        ),
    )
    zap_time_encoding: str | None = option(
        None,
        Flag(
            _D,
            "Time encoding of JSON log lines (default epoch).",
            Kind.TEXT,
            choices=ZAP_TIME_ENCODINGS,
        ),
    )
    tracing: bool = option(
        True,
        Flag(
            _D,
            "Enables emitting traces.",
            Kind.BOOL,
            no_effect="epp emits no OpenTelemetry traces",
            inert_value=False,
        ),
    )
    health_checking: bool = option(
        False,
        Flag(
            _D,
            "Enables health checking on the ext_proc port.",
            Kind.BOOL,
            no_effect="epp always answers grpc.health.v1 on the ext_proc and health ports",
            inert_value=True,
        ),
    )
    metrics_port: int = option(9090, Flag(_D, "The metrics port exposed by EPP.", Kind.INT))
    grpc_health_port: int = option(
        9003, Flag(_D, "The port used for gRPC liveness and readiness probes.", Kind.INT)
    )
    enable_pprof: bool = option(
        True,
        Flag(
            _D,
            "Enables pprof handlers.",
            Kind.BOOL,
            no_effect="a Go profiler; epp has none",
            inert_value=False,
        ),
    )
    cert_path: str | None = option(
        None,
        Flag(
            _D,
            "Directory holding tls.crt and tls.key for secure serving; if not set and "
            "--secure-serving is on, a self-signed certificate is made at start.",
            Kind.TEXT,
            metavar="DIR",
        ),
    )
    enable_cert_reload: bool = option(
        False,
        Flag(
            _D,
            "Reload the certificate of --cert-path when its files change (new connections "
            "get the new one).",
            Kind.BOOL,
        ),
    )
    enable_grpc_stream_metrics: bool = option(
        False,
        Flag(
            _D,
            "Enables ext_proc gRPC stream metrics.",
            Kind.BOOL,
            no_effect="epp has no ext_proc stream metrics yet",
            inert_value=False,
        ),
    )
    secure_serving: bool = option(
        True, Flag(_D, "Enables secure serving (TLS on the ext_proc port).", Kind.BOOL)
    )
    tls_min_version: str | None = option(
        None,
        Flag(
            _D,
            "Minimum TLS version for secure serving (default VersionTLS12).",
            Kind.TEXT,
            choices=TLS_VERSIONS,
        ),
    )
    tls_cipher_suites: tuple[str, ...] = option(
        (),
        Flag(
            _D,
            "Comma-separated TLS cipher suites for secure serving (Go crypto/tls names, e.g. "
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256); TLS 1.2 and below only.",
            Kind.TEXT_LIST,
        ),
    )
    metrics_endpoint_auth: bool = option(
        True,
        Flag(
            _D,
            "In cluster mode, /metrics needs a bearer token that the API server's "
            "TokenReview accepts and SubjectAccessReview allows (get on /metrics). "
            "In file mode /metrics is open.",
            Kind.BOOL,
        ),
    )
    metrics_client_ca_file: str | None = option(
        None,
        Flag(
            _D,
            "PEM CA for metrics mTLS.",
            Kind.TEXT,
            no_effect="epp serves /metrics without TLS",
        ),
    )
    metrics_cert_dir: str | None = option(
        None,
        Flag(
            _D,
            "Directory with the metrics server certificates.",
            Kind.TEXT,
            no_effect="epp serves /metrics without TLS",
        ),
    )

    # -- configuration ------------------------------------------------------------------------
    config_file: str | None = option(
        None,
        Flag(
            _C,
            "The EndpointPickerConfig file (reloaded when it changes).",
            Kind.TEXT,
            names=("--config-file", "--config"),
        ),
    )
    config_text: str | None = option(
        None, Flag(_C, "The EndpointPickerConfig as text, in lieu of a file.", Kind.TEXT)
    )
    allow_experimental_plugins: bool = option(
        False,
        Flag(
            _C,
            "Allows loading of experimental plugins (the reference's Alpha stability "
            "level; `epp plugins` shows each type's).",
            Kind.BOOL,
        ),
    )

    # -- epp only -------------------------------------------------------------------------------
    bind_address: str = option("0.0.0.0", Flag(_O, "Address of all listeners.", Kind.TEXT))
    ready_file: str | None = option(
        None,
        Flag(_O, "Once serving, write the bound ports there as JSON (for scripts).", Kind.TEXT),
    )
    endpoints: str | None = option(
        None,
        Flag(
            _O,
            "File mode: static endpoints, ip:port,... or @FILE (reloaded when it changes): "
            "such a list, or the reference's file-discovery YAML with labels per endpoint.",
            Kind.TEXT,
            metavar="LIST|@FILE",
        ),
    )
    objectives: tuple[str, ...] = option(
        (),
        Flag(
            _O,
            "File mode: InferenceObjective manifests (files or folders); default: the "
            "shipped samples.",
            Kind.PATHS,
            metavar="PATH",
        ),
    )
    pool_file: str | None = option(
        None,
        Flag(_O, "File mode: the InferencePool manifest.", Kind.TEXT, names=("--pool",),
             metavar="FILE"),
    )  # fmt: skip
    kubeconfig: str | None = option(
        None,
        Flag(_O, "Kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube).", Kind.TEXT),
    )
    file_watch_interval: float = option(
        1.0, Flag(_O, "How often input files are checked for changes.", Kind.DURATION)
    )
    max_body_bytes: int = option(
        16 * 1024 * 1024, Flag(_O, "Larger request bodies get 413.", Kind.SIZE)
    )
    workers: int = option(
        0,
        Flag(
            _O,
            "Protocol worker processes: this process keeps the decisions (flow control, "
            "scheduling, watches, metrics) and hands each ext_proc connection to one of N "
            "workers (TLS, HTTP/2, ext_proc, parsing); see docs/operations/workers.md. "
            "0: one process does everything.",
            Kind.INT,
        ),
    )
    decider_port: int | None = option(
        None,
        Flag(
            _O,
            "Be the pool's decider: serve the other replicas' decisions on this port "
            "(gRPC; 0: a free one). In cluster mode with leader election: decide while "
            "holding the Lease, else forward to its holder; see docs/operations/replicas.md.",
            Kind.INT,
        ),
    )
    decider: str | None = option(
        None,
        Flag(
            _O,
            "HOST:PORT of the pool's decider (its --decider-port): forward every decision "
            "to it, and admit within this replica's share while it does not answer.",
            Kind.TEXT,
            metavar="HOST:PORT",
        ),
    )
    replicas: int = option(
        1,
        Flag(
            _O,
            "EPP replicas of the pool, the decider included: a replica without a decider "
            "admits within 1/N of each endpoint's limit.",
            Kind.INT,
        ),
    )
    replica_id: str | None = option(
        None,
        Flag(
            _O,
            "This replica's name to its decider, the same across its restarts; "
            "default: the host name.",
            Kind.TEXT,
        ),
    )
    seed: int | None = option(
        None, Flag(_O, "Seed of the scheduler's random choices; default: a random one.", Kind.INT)
    )
    log_level: str | None = option(
        None,
        Flag(
            _O,
            "Log level; overrides -v and --zap-log-level.",
            Kind.TEXT,
            choices=("debug", "info", "warning", "error"),
        ),
    )

    logger_levels: tuple[str, ...] = option(
        (),
        Flag(
            _O,
            "Levels of other loggers by name, NAME=LEVEL,... (e.g. celpy=debug,aiohttp=info): "
            "the log level and -v set epp's own loggers only, every other library logs "
            "warnings and above unless named here.",
            Kind.TEXT_LIST,
            metavar="NAME=LEVEL,...",
        ),
    )

    default_model: str | None = option(
        None,
        Flag(
            _O,
            "The model of a request without `model`, as vLLM serves it with its served model "
            "(none: such a request gets 400, as in the reference EPP).",
            Kind.TEXT,
            metavar="NAME",
        ),
    )

    # -- ext_proc transport limits: one flag per field (`transport_flags`) -------------------
    transport: TransportLimits = field(default_factory=TransportLimits)

    # -- derived ------------------------------------------------------------------------------

    @property
    def cluster(self) -> bool:
        """Inputs from Kubernetes (a pool by name, or pods by selector)."""
        return self.endpoints is None and (
            self.pool_name is not None or self.endpoint_selector is not None
        )

    @property
    def served_pool_name(self) -> str | None:
        """The pool's name: `--pool-name`, or pool-less the EPP's Deployment's
        (from `$POD_NAME`), as the reference names it."""
        if self.pool_name is None and self.endpoint_selector is not None:
            pod_name = os.environ.get("POD_NAME")
            return deployment_name(pod_name) if pod_name else "epp"
        return self.pool_name

    @property
    def namespace(self) -> str:
        return self.pool_namespace or os.environ.get("NAMESPACE") or DEFAULT_NAMESPACE

    @property
    def cert_files(self) -> tuple[str, str] | None:
        if self.cert_path is None:
            return None
        return os.path.join(self.cert_path, "tls.crt"), os.path.join(self.cert_path, "tls.key")

    def transport_limits(self) -> TransportLimits:
        """The ext_proc port's limits, with the message sizes of
        --grpc-max-recv-msg-size and --grpc-max-send-msg-size."""
        sizes = {}
        if self.grpc_max_recv_msg_size is not None:
            sizes["max_receive_message_bytes"] = self.grpc_max_recv_msg_size
        if self.grpc_max_send_msg_size is not None:
            sizes["max_send_message_bytes"] = self.grpc_max_send_msg_size
        return dataclasses.replace(self.transport, **sizes)

    def problems(self) -> list[str]:
        """What makes these options unusable together (empty: usable)."""
        found = []
        if self.pool_name is not None and self.endpoint_selector is not None:
            found.append("--pool-name and --endpoint-selector cannot both be set")
        if self.endpoint_selector is not None and not 1 <= len(self.endpoint_target_ports) <= 8:
            found.append("--endpoint-target-ports needs 1 to 8 ports with --endpoint-selector")
        if any(not 0 < port < 65536 for port in self.endpoint_target_ports):
            found.append("--endpoint-target-ports: a port is outside 1-65535")
        if self.config_file is not None and self.config_text is not None:
            found.append("--config-file and --config-text cannot both be set")
        if self.pool_group != POOL_GROUP:
            found.append(f"--pool-group {self.pool_group!r}: only {POOL_GROUP!r} is supported")
        if self.zap_log_level is not None and not (
            self.zap_log_level in ZAP_LEVELS or self.zap_log_level.isdigit()
        ):
            found.append(
                f"--zap-log-level {self.zap_log_level!r}: use debug, info, error, panic "
                "or a verbosity > 0"
            )
        for item in self.logger_levels:
            name, _, level = item.partition("=")
            if not name or level.lower() not in LOGGER_LEVELS:
                found.append(
                    f"--logger-levels {item!r}: write NAME=LEVEL with LEVEL one of "
                    + ", ".join(LOGGER_LEVELS)
                )
        if not 0 <= self.workers <= MAX_WORKERS:
            found.append(f"--workers {self.workers}: use 0 to {MAX_WORKERS}")
        if self.enable_cert_reload and self.cert_path is None:
            found.append("--enable-cert-reload needs --cert-path")
        if self.decider is not None and self.decider_port is not None:
            found.append("--decider and --decider-port cannot both be set")
        if (self.decider is not None or self.decider_port is not None) and self.workers:
            found.append("--decider and --decider-port do not run with --workers yet")
        if self.cluster and self.decider is not None:
            found.append("--decider: in cluster mode the Lease names the decider")
        if self.cluster and self.decider_port is not None and not self.ha_enable_leader_election:
            found.append("--decider-port in cluster mode needs --ha-enable-leader-election")
        if self.replicas < 1:
            found.append(f"--replicas {self.replicas}: at least 1")
        return found

    def inert_warnings(self, given: Mapping[str, Any]) -> list[str]:
        """One line per given flag that means nothing in epp."""
        lines = []
        for name, flag in flags():
            if name not in given or flag.no_effect is None:
                continue
            value = given[name]
            if flag.inert_value is not NOT_SET and value == flag.inert_value:
                continue
            lines.append(
                f"{flag_name(name, flag)}={shown(value, flag.kind)} has no effect in epp: "
                f"{flag.no_effect}"
            )
        return lines


def deployment_name(pod_name: str) -> str:
    """The Deployment of a pod named `<deployment>-<replicaset hash>-<pod hash>`."""
    parts = pod_name.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else pod_name


def flags() -> Iterator[tuple[str, Flag]]:
    """(field name, flag) of every option that is a flag, in definition order."""
    return table_flags(ServeOptions)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per option (`epp.serve.flags.add_table_arguments`)."""
    add_table_arguments(parser, ServeOptions)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line, by field name."""
    return given_values(args, ServeOptions)


def options_from(args: argparse.Namespace) -> ServeOptions:
    return ServeOptions(**given_options(args))
