"""Certificates for trying TLS locally and for the tests: a CA, a server and a client certificate.

``python -m tools.dev_certs DIR [--host NAME ...] [--days N]`` writes ``ca.crt``, ``server.crt``,
``server.key``, ``client.crt`` and ``client.key`` (PEM, keys unencrypted, mode 0600) into DIR.
The server certificate names ``localhost``, ``127.0.0.1`` and ``::1`` plus every ``--host``.
For production use your CA (cert-manager in Kubernetes: deploy/kubernetes/tls/).

The functions build the same pieces in code (the TLS tests and ``bench_server --tls`` use them).
They need the ``cryptography`` package.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Issued:
    """A certificate and its key (cryptography objects), with PEM writers."""

    cert: Any
    key: Any

    @property
    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    def write(self, cert_path: str | os.PathLike, key_path: str | os.PathLike | None = None) -> None:
        Path(cert_path).write_bytes(self.cert_pem)
        if key_path is not None:
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.key_pem)


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str = "serving-processor test CA", days: float = 30) -> Issued:
    """A self-signed CA (EC P-256)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(cert, key)


def issue(ca: Issued, common_name: str, *, hosts: tuple[str, ...] = (), client: bool = False,
          days: float = 30, not_after: datetime.datetime | None = None, key: Any = None) -> Issued:
    """A leaf certificate signed by ``ca``: a server certificate naming ``hosts`` (DNS names or IP
    addresses), or with ``client`` a client certificate. ``key``: reuse a private key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = key or ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    end = not_after or now + datetime.timedelta(days=days)
    sans = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca.cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(min(now - datetime.timedelta(hours=1), end - datetime.timedelta(hours=2)))
               .not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                     else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def write_set(out: str | os.PathLike, hosts: tuple[str, ...] = (), days: float = 30) -> dict[str, Path]:
    """CA, server and client certificates in ``out``; returns the paths by name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ca = make_ca(days=days)
    paths = {name: out / name for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}
    ca.write(paths["ca.crt"])
    issue(ca, "serving-processor", hosts=LOCAL_HOSTS + tuple(hosts), days=days).write(
        paths["server.crt"], paths["server.key"])
    issue(ca, "serving-processor-client", client=True, days=days).write(paths["client.crt"], paths["client.key"])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dev_certs", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory to write the PEM files into")
    parser.add_argument("--host", action="append", default=[], help="another DNS name or IP of the server")
    parser.add_argument("--days", type=float, default=30)
    args = parser.parse_args(argv)
    for name, path in write_set(args.out, tuple(args.host), args.days).items():
        print(f"{name:11s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
