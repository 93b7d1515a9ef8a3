"""TLS for both servers: the certificate files loaded and checked, the contexts built, and the
files re-read when they change on disk.

:class:`TlsCertificates` reads ``tls_cert_file``, ``tls_key_file`` (or the PEM in the
environment variable ``tls_key_env``) and ``tls_client_ca_file`` once at start and checks them:
an unreadable or non-PEM file, a key that does not match the certificate, an encrypted key or an
expired certificate is a :class:`~processor.errors.ConfigError` naming the key; a certificate
that expires within :data:`EXPIRY_WARNING_DAYS` days is logged as a warning with its date.

Reload: a watcher thread stats the files every ``tls_reload_interval_seconds``; when one changed
(cert-manager and the kubelet swap a Secret's files atomically), the new set is loaded and
checked the same way and published to the listeners; a set that fails the checks is logged once
and the previous one stays in use. Open connections are never touched: the HTTPS server swaps the
context new handshakes use (:class:`HttpsContext`), gRPC asks for a new certificate configuration
on each handshake (:func:`grpc_server_credentials`).

The bytes checked are the bytes loaded: Python's ``ssl`` reads a certificate chain only from a
file, so the checked PEM is written to a private temporary directory, loaded, and removed.

Thread safety: :class:`TlsCertificates` publishes an immutable :class:`TlsMaterial`; readers
take the current one with one attribute read. Listeners run on the watcher thread.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from processor.errors import ConfigError

from .settings import DeploymentConfig

log = logging.getLogger("server.tls")

EXPIRY_WARNING_DAYS = 7
_MAX_PEM_BYTES = 1 << 20  # a certificate chain, key or CA bundle larger than this is not one


@dataclass(frozen=True)
class TlsMaterial:
    """One checked set of files: PEM bytes and what the log lines name."""

    cert_chain: bytes
    key: bytes
    client_ca: bytes | None
    subject: str
    serial: str
    not_after: datetime.datetime
    fingerprint: str  # SHA-256 of the leaf certificate (DER), hex

    def describe(self) -> str:
        return (f"{self.subject} (serial {self.serial}, expires {self.not_after:%Y-%m-%d %H:%M} UTC, "
                f"sha256 {self.fingerprint[:16]}...)")


def load_material(dep: DeploymentConfig, now: datetime.datetime | None = None) -> TlsMaterial:
    """Read and check the deployment's TLS files; ConfigError naming the key on any problem."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization

    now = now or datetime.datetime.now(datetime.timezone.utc)
    chain_pem = _read("tls_cert_file", dep.tls_cert_file)
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError as exc:
        raise ConfigError(f"tls_cert_file: {dep.tls_cert_file!r} holds no PEM certificate ({exc})") from None
    leaf = chain[0]

    if dep.tls_key_env:
        value = os.environ.get(dep.tls_key_env, "")
        if not value:
            raise ConfigError(f"tls_key_env: environment variable {dep.tls_key_env!r} is not set or empty")
        key_pem, key_name = value.encode(), "tls_key_env"
    else:
        key_pem, key_name = _read("tls_key_file", dep.tls_key_file), "tls_key_file"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:  # cryptography: a password is needed
        raise ConfigError(f"{key_name}: the private key is encrypted; give it unencrypted "
                          f"(protect it with file permissions or a Secret)") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"{key_name}: no PEM private key could be read ({_first_line(exc)})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if (key.public_key().public_bytes(serialization.Encoding.DER, public)
            != leaf.public_key().public_bytes(serialization.Encoding.DER, public)):
        raise ConfigError(f"{key_name}: the private key does not match the certificate in tls_cert_file "
                          f"({leaf.subject.rfc4514_string()})")

    not_after = leaf.not_valid_after_utc
    subject = leaf.subject.rfc4514_string() or "(empty subject)"
    if not_after <= now:
        raise ConfigError(f"tls_cert_file: the certificate {subject} expired on {not_after:%Y-%m-%d %H:%M} UTC")
    if leaf.not_valid_before_utc > now:
        log.warning("TLS certificate %s is not valid before %s UTC (clock skew?)", subject,
                    f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M}")

    client_ca = None
    if dep.tls_client_ca_file:
        client_ca = _read("tls_client_ca_file", dep.tls_client_ca_file)
        try:
            x509.load_pem_x509_certificates(client_ca)
        except ValueError as exc:
            raise ConfigError(f"tls_client_ca_file: {dep.tls_client_ca_file!r} holds no PEM "
                              f"certificate ({exc})") from None

    material = TlsMaterial(cert_chain=chain_pem, key=key_pem, client_ca=client_ca, subject=subject,
                           serial=format(leaf.serial_number, "x"), not_after=not_after,
                           fingerprint=leaf.fingerprint(hashes.SHA256()).hex())
    left = not_after - now
    if left <= datetime.timedelta(days=EXPIRY_WARNING_DAYS):
        log.warning("TLS certificate %s expires on %s UTC, in %.1f days: renew it", subject,
                    f"{not_after:%Y-%m-%d %H:%M}", left.total_seconds() / 86400,
                    extra={"expires": not_after.isoformat()})
    return material


def _read(key: str, path: str | None) -> bytes:
    try:
        with open(path, "rb") as f:  # type: ignore[arg-type]
            data = f.read(_MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc.strerror or exc}") from None
    if len(data) > _MAX_PEM_BYTES:
        raise ConfigError(f"{key}: {path!r} is over {_MAX_PEM_BYTES} bytes; not a PEM file")
    return data


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _signature(paths: list[str]) -> tuple:
    """What changes when a file is replaced (stat follows the kubelet's ..data symlinks)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class TlsCertificates:
    """The current :class:`TlsMaterial` of a deployment, reloaded when its files change.

    Construction loads and checks the files (ConfigError). :meth:`start` runs the watcher thread
    (when ``tls_reload_interval_seconds`` > 0), :meth:`stop` ends it. ``listeners`` are called with
    each newly loaded material, on the watcher thread.
    """

    def __init__(self, dep: DeploymentConfig) -> None:
        self.deployment = dep
        self.material = load_material(dep)
        self.generation = 0  # +1 per reload
        self.listeners: list[Callable[[TlsMaterial], None]] = []
        self._paths = [p for p in (dep.tls_cert_file, dep.tls_key_file, dep.tls_client_ca_file) if p]
        self._seen = _signature(self._paths)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        log.info("TLS certificate %s", self.material.describe())

    def start(self) -> None:
        if self.deployment.tls_reload_interval_seconds > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="sp-tls-reload", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.deployment.tls_reload_interval_seconds):
            self.check()

    def check(self) -> bool:
        """Reload when the files changed since the last look; True when a new set is in use."""
        signature = _signature(self._paths)
        if signature == self._seen:
            return False
        self._seen = signature  # a bad set is reported once, not at every look
        try:
            material = load_material(self.deployment)
        except ConfigError as exc:
            log.error("TLS files changed but were not loaded (still serving %s): %s",
                      self.material.describe(), exc.message)
            return False
        except Exception:
            log.exception("TLS reload failed (still serving %s)", self.material.describe())
            return False
        if (material.cert_chain, material.key, material.client_ca) == (
                self.material.cert_chain, self.material.key, self.material.client_ca):
            return False
        for listener in self.listeners:  # build every context first: a failure keeps the old set
            try:
                listener(material)
            except Exception as exc:
                log.error("TLS files changed but were not loaded (still serving %s): %s",
                          self.material.describe(), _first_line(exc))
                return False
        self.material = material
        self.generation += 1
        log.info("TLS certificate reloaded: now %s", material.describe())
        return True


# --- HTTPS --------------------------------------------------------------------------------------

def ssl_context(material: TlsMaterial, dep: DeploymentConfig) -> ssl.SSLContext:
    """A server SSLContext for ``material`` with the deployment's version and client-cert rules."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if dep.tls_min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="sp-tls-") as tmp:  # 0700; removed right after loading
        cert_path, key_path = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for path, data in ((cert_path, material.cert_chain), (key_path, material.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)
    if material.client_ca is not None:
        ctx.load_verify_locations(cadata=material.client_ca.decode("ascii", "replace"))
        ctx.verify_mode = ssl.CERT_REQUIRED if dep.tls_require_client_cert else ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class HttpsContext:
    """The SSLContext the HTTPS listener is created with, following certificate reloads.

    ``context`` is built once; its SNI callback (which OpenSSL calls on every handshake, with or
    without a server name) moves each new connection onto the newest context. Connections already
    open keep theirs. Thread-safe: :meth:`update` replaces one reference.
    """

    def __init__(self, certificates: TlsCertificates) -> None:
        dep = certificates.deployment
        self.context = ssl_context(certificates.material, dep)
        self._current = self.context
        self.context.sni_callback = self._pick
        certificates.listeners.append(lambda material: self.update(ssl_context(material, dep)))

    def update(self, context: ssl.SSLContext) -> None:
        self._current = context

    def _pick(self, connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        current = self._current
        if current is not context:
            connection.context = current
        return None


def client_identity(transport: Any) -> tuple[str, ...] | None:
    """The names of the verified client certificate on ``transport`` (subject CN, DNS and URI
    SANs); None when the connection is not TLS or the client presented none."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:  # ssl returns {} / None unless a certificate was presented and verified
        return None
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    names += [value for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "URI")]
    return tuple(names)


# --- gRPC ---------------------------------------------------------------------------------------

def grpc_server_credentials(certificates: TlsCertificates) -> Any:
    """``grpc.dynamic_ssl_server_credentials`` serving the newest material.

    gRPC calls the fetcher on each new handshake; it answers a new configuration once per reload
    (None: keep the current one), so it costs one integer comparison per connection.
    """
    import grpc

    def config(material: TlsMaterial) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.cert_chain)], root_certificates=material.client_ca)

    served = [certificates.generation]

    def fetch() -> Any:
        generation = certificates.generation
        if generation == served[0]:
            return None
        served[0] = generation
        return config(certificates.material)

    return grpc.dynamic_ssl_server_credentials(
        config(certificates.material), fetch,
        require_client_authentication=certificates.deployment.tls_require_client_cert)
