"""The reference runner's flags, as `epp serve` takes them.

`ReferenceOptions` holds one field per flag of the reference EPP (llm-d-router
`pkg/epp/server/options.go`, its logging options, and controller-runtime's
`--zap-*` flags), in its groups: ext_proc, InferencePool, endpoints,
model-server metrics scraping, diagnostics, configuration. Names, defaults
and help follow the reference; a flag without meaning here carries why
(`Flag.no_effect`). `epp.serve.options.ServeOptions` adds the flags only `epp`
has; the checks across both are there.

This module imports nothing heavy: `epp serve --help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.serve.flags import Flag, Group, Kind, option

POOL_GROUP = "inference.networking.k8s.io"
TLS_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")
ZAP_LEVELS = ("debug", "info", "error", "panic")
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


@dataclass(slots=True, frozen=True)
class ReferenceOptions:
    """The reference runner's flags (see the module docstring); the base of
    `ServeOptions`. Durations are seconds, sizes bytes."""

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
