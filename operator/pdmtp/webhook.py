"""Serving the validating webhook: a self-signed certificate made at start-up (no Secret to read)
and the kopf webhook server that presents it. Opt-in with `pdmtp run --webhook-listen`."""

from __future__ import annotations

import datetime
import ipaddress
import tempfile
from dataclasses import dataclass
from pathlib import Path

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

MANAGED_CONFIGURATION = "pdmtp.io"
"""Name of the ValidatingWebhookConfiguration kopf keeps up to date with --webhook-manage."""


@dataclass(frozen=True)
class WebhookOptions:
    addr: str
    port: int
    host: str
    """The name the API server dials (the Service's DNS name in a cluster, 127.0.0.1 locally)."""
    manage: bool


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def self_signed(names: list[str], directory: Path) -> tuple[Path, Path, bytes]:
    """A one-year self-signed serving certificate for `names`: (cert file, key file, PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in dict.fromkeys(names)]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(pem)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, pem


def server(options: WebhookOptions) -> kopf.WebhookServer:
    """kopf's webhook server with a fresh certificate; its PEM becomes the caBundle."""
    directory = Path(tempfile.mkdtemp(prefix="pdmtp-webhook-"))
    cert, key, pem = self_signed([options.host, options.addr], directory)
    return kopf.WebhookServer(
        addr=options.addr,
        port=options.port,
        host=options.host,
        certfile=str(cert),
        pkeyfile=str(key),
        cadata=pem,
    )
