"""The options of `epp serve`, defined once.

`ServeOptions` is the table: each field is one flag, with its type, default,
group, help and, for a flag that means nothing here, why. The reference
runner's flags are its base, `epp.serve.reference_options.ReferenceOptions`;
the flags only `epp` has, the transport limits and the checks across all of
them are here. From the table come the argparse parser (`add_arguments`),
`epp serve --help` (grouped as the reference runner's options are: ext_proc,
InferencePool, endpoints, model-server metrics scraping, diagnostics,
configuration; then the flags only `epp` has), and the options object
(`options_from`).

A flag without meaning here is accepted, and `inert_warnings` gives one line
for each one given with a value that would ask for something `epp` does not do.

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
from epp.serve.reference_options import POOL_GROUP, ZAP_LEVELS, ReferenceOptions
from epp.serve.token_store import DEFAULT_LIMITS, TokenCacheLimits
from epp.transport.limits import TransportLimits

MAX_WORKERS = 64
"""The most protocol worker processes `--workers` starts."""

DEFAULT_NAMESPACE = "default"
LOGGER_LEVELS = ("debug", "info", "warning", "error", "critical")

_O = Group.EPP


@dataclass(slots=True, frozen=True)
class ServeOptions(ReferenceOptions):
    """Everything `epp serve` is told; each field is one flag (see the module
    docstring). Durations are seconds, sizes bytes."""

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
    ha_lease_duration: float = option(
        15.0,
        Flag(
            _O,
            "With --ha-enable-leader-election: how long the Lease holds after its holder's "
            "last renewal (the reference keeps controller-runtime's 15s); a holder that dies "
            "without releasing it is replaced after this long.",
            Kind.DURATION,
        ),
    )
    ha_renew_deadline: float = option(
        10.0,
        Flag(
            _O,
            "With --ha-enable-leader-election: a holder that could not renew the Lease for "
            "this long steps down (shorter than --ha-lease-duration).",
            Kind.DURATION,
        ),
    )
    ha_retry_period: float = option(
        2.0,
        Flag(
            _O,
            "With --ha-enable-leader-election: how often each replica reads (and the holder "
            "renews) the Lease (shorter than --ha-renew-deadline).",
            Kind.DURATION,
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

    token_store_blocks: int = option(
        DEFAULT_LIMITS.store_blocks,
        Flag(
            _O,
            "The local token-producer's prefix store: blocks of 256 characters' tokens kept "
            "(about 710 bytes each: 210 MB at the default; the reference keeps 500,000 "
            "blocks), the least recently used dropped past it. Per process under --workers.",
            Kind.INT,
        ),
    )
    digest_memo_entries: int = option(
        DEFAULT_LIMITS.memo_digests,
        Flag(
            _O,
            "Block digests the token producer remembers for the precise prefix cache "
            "(about 800 bytes each: 40 MB at the default); past it it starts over. Per "
            "process under --workers.",
            Kind.INT,
        ),
    )
    tokenizer_max_learning: int = option(
        DEFAULT_LIMITS.max_learning,
        Flag(
            _O,
            "Prompts the local token-producer encodes at once off their requests' path (the "
            "rest of a prompt its prefix store covered less than 80%); past it a prompt is "
            "routed on the store's tokens and its rest not learned. Per process.",
            Kind.INT,
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

    def token_cache_limits(self) -> TokenCacheLimits:
        return TokenCacheLimits(
            self.token_store_blocks, self.digest_memo_entries, self.tokenizer_max_learning
        )

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
        if self.cluster and self.decider is not None:
            found.append("--decider: in cluster mode the Lease names the decider")
        if self.cluster and self.decider_port is not None and not self.ha_enable_leader_election:
            found.append("--decider-port in cluster mode needs --ha-enable-leader-election")
        if self.replicas < 1:
            found.append(f"--replicas {self.replicas}: at least 1")
        for flag, value in (
            ("--token-store-blocks", self.token_store_blocks),
            ("--digest-memo-entries", self.digest_memo_entries),
            ("--tokenizer-max-learning", self.tokenizer_max_learning),
        ):
            if value < 0:
                found.append(f"{flag} {value}: at least 0")
        if not self.ha_lease_duration > self.ha_renew_deadline > self.ha_retry_period > 0:
            found.append(
                "--ha-lease-duration, --ha-renew-deadline, --ha-retry-period: each shorter "
                f"than the one before and above 0, got {self.ha_lease_duration:g}s, "
                f"{self.ha_renew_deadline:g}s, {self.ha_retry_period:g}s"
            )
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
