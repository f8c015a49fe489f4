"""`epp envoy-config`: config/envoy/envoy.yaml filled in, for an EPP on this
machine (file mode, `epp serve --endpoints ...`) or for a pool's EPP in a
cluster (`--pool NAME`).

    epp envoy-config > envoy.yaml              # Envoy on 127.0.0.1:8081, the EPP on 127.0.0.1:9002
    epp envoy-config --pool vllm-llama3-8b     # the EPP Service vllm-llama3-8b-epp.default.svc...
    envoy -c envoy.yaml

For a pool the EPP is reached at its Service, `<pool>-epp.<namespace>.svc.
<cluster domain>`, the name the reference's Helm chart gives it, through a
STRICT_DNS cluster as the chart's proxy in service mode; an IP address gets
a STATIC cluster. Envoy speaks TLS to the EPP (`epp serve`'s
`--secure-serving` is on by default) unless `--plaintext`.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from epp.api.address import canonical_ip, valid_port
from epp.cli import given
from epp.demo.envoy_process import DEFAULT_TEMPLATE, render

EPP_PORT = 9002
LISTEN_PORT = 8081
ADMIN = "127.0.0.1:9901"
TLS_BLOCK_START = "    transport_socket:\n      name: envoy.transport_sockets.tls\n"
TLS_BLOCK_END = "    typed_extension_protocol_options:\n"


@dataclass(slots=True, frozen=True)
class EnvoyTarget:
    """Where Envoy listens, and where it finds the EPP."""

    listen: str = f"127.0.0.1:{LISTEN_PORT}"
    admin: str = ADMIN
    epp: str = f"127.0.0.1:{EPP_PORT}"
    tls: bool = True
    """Whether the EPP serves TLS (`epp serve --secure-serving`, on by default)."""


def pool_epp_address(pool: str, namespace: str, cluster_domain: str = "cluster.local") -> str:
    """The ext_proc address of a pool's EPP Service (the reference chart's `<pool>-epp`)."""
    return f"{pool}-epp.{namespace}.svc.{cluster_domain}:{EPP_PORT}"


HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def host_and_port(text: str, free_port: bool = False) -> tuple[str, int, bool]:
    """(host, port, whether the host is an IP address) of `host:port`, the
    host an IP address (IPv6 as `[ip]`) or a DNS name; port 0 only with
    `free_port` (a listener for which Envoy picks a free port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not host:port")
    port = 0 if free_port and port_text == "0" else valid_port(port_text)
    try:
        return canonical_ip(host.strip("[]")), port, True
    except ValueError:
        if HOST_NAME.fullmatch(host) is None:
            raise ValueError(
                f"{text!r}: {host!r} is neither an IP address nor a DNS name"
            ) from None
        return host, port, False


def envoy_config(target: EnvoyTarget, template: Path = DEFAULT_TEMPLATE) -> str:
    """The template filled in for `target`."""
    listen_host, listen_port, _ = host_and_port(target.listen, free_port=True)
    admin_host, admin_port, _ = host_and_port(target.admin, free_port=True)
    epp_host, epp_port, epp_is_ip = host_and_port(target.epp)
    cluster = "STATIC" if epp_is_ip else "STRICT_DNS"
    text = render(
        template,
        LISTEN_ADDRESS=listen_host,
        LISTEN_PORT=listen_port,
        ADMIN_ADDRESS=admin_host,
        ADMIN_PORT=admin_port,
        EPP_ADDRESS=epp_host,
        EPP_PORT=epp_port,
        EPP_CLUSTER_TYPE=cluster,
    )
    text = (
        f"# Written by `epp envoy-config` from config/envoy/envoy.yaml: Envoy on "
        f"{target.listen},\n# the EPP at {target.epp} "
        f"({'TLS' if target.tls else 'plaintext'}, a {cluster} cluster).\n" + text
    )
    if not target.tls:
        start, end = text.find(TLS_BLOCK_START), text.find(TLS_BLOCK_END)
        if start < 0 or end < start:
            raise ValueError(f"{template}: no TLS block to remove in the epp cluster")
        text = text[:start] + text[end:]
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pool",
        metavar="NAME",
        help="the EPP is the pool's in a cluster: its Service <NAME>-epp.<namespace>.svc",
    )
    parser.add_argument("--namespace", default="default", help="the pool's (default: default)")
    parser.add_argument(
        "--cluster-domain", default="cluster.local", help="(default: cluster.local)"
    )
    parser.add_argument(
        "--epp",
        metavar="HOST:PORT",
        help=f"the EPP's ext_proc address (default: 127.0.0.1:{EPP_PORT}, or the pool's Service)",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"Envoy's listener for clients (default: 127.0.0.1:{LISTEN_PORT}; "
        f"0.0.0.0:{LISTEN_PORT} with --pool)",
    )
    parser.add_argument(
        "--admin", metavar="HOST:PORT", default=ADMIN, help=f"Envoy's admin (default: {ADMIN})"
    )
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="the EPP serves without TLS (epp serve --secure-serving=false)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")


def target_of(args: argparse.Namespace) -> EnvoyTarget:
    epp = args.epp or (
        pool_epp_address(args.pool, args.namespace, args.cluster_domain)
        if args.pool
        else f"127.0.0.1:{EPP_PORT}"
    )
    listen = args.listen or f"{'0.0.0.0' if args.pool else '127.0.0.1'}:{LISTEN_PORT}"
    return EnvoyTarget(listen=listen, admin=args.admin, epp=epp, tls=not args.plaintext)


def run(args: argparse.Namespace) -> int:
    target = given(target_of, args)
    text = given(envoy_config, target)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(
            f"wrote {args.output}: Envoy on {target.listen}, the EPP at {target.epp} "
            f"({'TLS' if target.tls else 'plaintext'}); run: envoy -c {args.output}",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0
