"""TLS for the ext_proc port: given certificate files, or a self-signed
certificate made at start (as the reference EPP does with --secure-serving
and no --cert-path; Envoy connects without validating it)."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SELF_SIGNED_VALIDITY = datetime.timedelta(days=365)


def self_signed_certificate(common_name: str | None = None) -> tuple[bytes, bytes]:
    """A fresh (certificate PEM, private key PEM) pair, valid for a year,
    for `common_name` (default: this host's name), localhost and 127.0.0.1."""
    name = common_name or socket.gethostname()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + SELF_SIGNED_VALIDITY)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(name),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def server_ssl_context(cert_path: str | None = None, key_path: str | None = None) -> ssl.SSLContext:
    """TLS for the ext_proc port from the given PEM files, or self-signed when
    neither is given: TLS 1.2 or later, ALPN `h2` (gRPC clients require it)."""
    if (cert_path is None) != (key_path is None):
        raise ValueError("--cert-path and --key-path go together")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    if cert_path is not None and key_path is not None:
        context.load_cert_chain(cert_path, key_path)
        return context
    certificate, key = self_signed_certificate()
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as directory:
        chain = Path(directory) / "chain.pem"
        chain.write_bytes(key + certificate)
        context.load_cert_chain(chain)
    return context
