"""TLS on the ext_proc port as the reference's flags set it: on by default,
the certificate of --cert-path (reloaded with --enable-cert-reload), the
minimum version and the TLS 1.2 cipher suites."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from epp.serve.tls import openssl_ciphers, self_signed_certificate
from tests.support.health import health_status, health_status_at
from tests.support.serving import serving


def write_certificate(folder: Path, name: str) -> str:
    certificate, key = self_signed_certificate(name)
    (folder / "tls.key").write_bytes(key)
    (folder / "tls.crt").write_bytes(certificate)
    return ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(certificate.decode()))


@contextlib.asynccontextmanager
async def ext_proc_port(**options: object) -> AsyncIterator[int]:
    async with serving(endpoints="127.0.0.1:1", **options) as server:
        yield server.ports["grpc"]


def handshake(port: int, maximum: ssl.TLSVersion | None = None) -> tuple[str, str, bytes]:
    """(version, cipher, server certificate DER) of a TLS handshake with the port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if maximum is not None:
        context.maximum_version = maximum
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        return tls.version() or "", tls.cipher()[0], tls.getpeercert(binary_form=True) or b""


async def test_the_ext_proc_port_speaks_tls_by_default():
    async with ext_proc_port() as port:
        version, _, certificate = await asyncio.to_thread(handshake, port)
    assert version in ("TLSv1.2", "TLSv1.3") and certificate


async def test_secure_serving_false_serves_plaintext():
    async with ext_proc_port(secure_serving=False) as port:
        with pytest.raises(ssl.SSLError):
            await asyncio.to_thread(handshake, port)


async def test_the_certificate_of_cert_path_is_served_and_reloaded(tmp_path):
    first = write_certificate(tmp_path, "first.example")
    async with ext_proc_port(
        cert_path=str(tmp_path), enable_cert_reload=True, file_watch_interval=0.05
    ) as port:
        _, _, served = await asyncio.to_thread(handshake, port)
        assert ssl.DER_cert_to_PEM_cert(served) == first
        second = write_certificate(tmp_path, "second.example")
        async with asyncio.timeout(5):
            while ssl.DER_cert_to_PEM_cert(served) != second:
                await asyncio.sleep(0.05)
                _, _, served = await asyncio.to_thread(handshake, port)


async def test_without_cert_reload_the_first_certificate_stays(tmp_path):
    first = write_certificate(tmp_path, "first.example")
    async with serving(endpoints="127.0.0.1:1", cert_path=str(tmp_path)) as server:
        write_certificate(tmp_path, "second.example")
        server.watcher.check()  # one look at the input files, as the watcher's timer takes
        _, _, served = await asyncio.to_thread(handshake, server.ports["grpc"])
    assert ssl.DER_cert_to_PEM_cert(served) == first


async def test_tls_min_version_refuses_older_clients():
    async with ext_proc_port(tls_min_version="VersionTLS13") as port:
        with pytest.raises(ssl.SSLError):
            await asyncio.to_thread(handshake, port, ssl.TLSVersion.TLSv1_2)
        version, _, _ = await asyncio.to_thread(handshake, port)
    assert version == "TLSv1.3"


async def test_tls_cipher_suites_choose_the_tls12_suite():
    suite = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"
    async with ext_proc_port(tls_cipher_suites=(suite,)) as port:
        _, cipher, _ = await asyncio.to_thread(handshake, port, ssl.TLSVersion.TLSv1_2)
    assert cipher == "ECDHE-ECDSA-AES256-GCM-SHA384"


def test_an_unknown_cipher_suite_is_named():
    with pytest.raises(ValueError, match="TLS_NOPE"):
        openssl_ciphers(("TLS_NOPE",))


def test_tls13_suites_are_accepted_and_left_alone():
    assert openssl_ciphers(("TLS_AES_128_GCM_SHA256",)) is None


async def test_grpc_clients_that_trust_the_certificate_get_health(tmp_path):
    write_certificate(tmp_path, "localhost")
    certificate = (tmp_path / "tls.crt").read_bytes()
    async with ext_proc_port(cert_path=str(tmp_path)) as port:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate)
        async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
            assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await health_status_at(port)


async def test_the_self_signed_certificate_serves_grpc_health():
    async with ext_proc_port() as port:
        assert await health_status_at(port, tls=True) == health_pb2.HealthCheckResponse.SERVING
