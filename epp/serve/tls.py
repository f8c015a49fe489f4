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


TLS_VERSIONS = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}
"""`--tls-min-version` values (Go's names) -> Python's."""

GO_CIPHER_SUITES = {
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
"""Go crypto/tls cipher suite names (`--tls-cipher-suites`) -> OpenSSL's."""
TLS13_SUITES = frozenset(
    {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
)
"""Accepted and left alone: TLS 1.3 suites are not configurable (in Go either)."""


def openssl_ciphers(go_names: tuple[str, ...]) -> str | None:
    """The OpenSSL cipher string for Go suite names; ValueError for an unknown
    one; None when only TLS 1.3 suites (or none) are named."""
    chosen = []
    for name in go_names:
        if name in TLS13_SUITES:
            continue
        openssl = GO_CIPHER_SUITES.get(name)
        if openssl is None:
            raise ValueError(f"--tls-cipher-suites: unknown cipher suite {name!r}")
        chosen.append(openssl)
    return ":".join(chosen) or None


def server_ssl_context(
    cert_files: tuple[str, str] | None = None,
    min_version: str | None = None,
    cipher_suites: tuple[str, ...] = (),
    self_signed: tuple[bytes, bytes] | None = None,
) -> ssl.SSLContext:
    """TLS for the ext_proc port from (certificate, key) PEM files, or
    self-signed when none are given (`self_signed`, else a fresh pair: the
    protocol workers of one EPP share one): TLS 1.2 or later unless `min_version`
    says otherwise, ALPN `h2` (gRPC clients require it). `load_cert_chain`
    on the returned context again swaps the certificate for new connections
    (`--enable-cert-reload`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[min_version or "VersionTLS12"]
    ciphers = openssl_ciphers(cipher_suites)
    if ciphers is not None:
        try:
            context.set_ciphers(ciphers)
        except ssl.SSLError as error:
            raise ValueError(f"--tls-cipher-suites: {error}") from None
    context.set_alpn_protocols(["h2"])
    if cert_files is not None:
        context.load_cert_chain(*cert_files)
        return context
    certificate, key = self_signed or self_signed_certificate()
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as directory:
        chain = Path(directory) / "chain.pem"
        chain.write_bytes(key + certificate)
        context.load_cert_chain(chain)
    return context
