"""TLS configuration (issue 31): the deployment keys are validated strictly with errors that name
the key; the certificate files are checked by server/tls.py (unreadable, not PEM, key not
matching, encrypted key, expired: ConfigError naming the key; expiring within 7 days: a warning
with the date); a reload picks up changed files and keeps the old set when the new one is bad;
the admin gate lets in a verified client certificate as an alternative to the token.
Certificates are generated here with ``cryptography`` (tools/dev_certs.py)."""

from __future__ import annotations

import datetime
import logging
import os
import ssl

import pytest

pytest.importorskip("cryptography")

from server.settings import DeploymentConfig  # noqa: E402
from processor.errors import ConfigError  # noqa: E402
from server import tls  # noqa: E402
from tools.dev_certs import LOCAL_HOSTS, issue, make_ca  # noqa: E402

MODEL = {"savedmodel_dir": "/models/toy/savedmodel"}


@pytest.fixture(scope="module")
def ca():
    return make_ca()


@pytest.fixture
def pki(tmp_path, ca):
    server = issue(ca, "server", hosts=LOCAL_HOSTS)
    server.write(tmp_path / "server.crt", tmp_path / "server.key")
    ca.write(tmp_path / "ca.crt")
    return tmp_path


def deployment(pki=None, **top) -> DeploymentConfig:
    keys = {}
    if pki is not None:
        keys = {"tls_cert_file": str(pki / "server.crt"), "tls_key_file": str(pki / "server.key")}
    return DeploymentConfig.from_dict({"models": [{"name": "toy", "model_config": dict(MODEL)}],
                                       **keys, **top})


# --- the keys ----------------------------------------------------------------------------------

def test_defaults_are_plaintext():
    d = deployment()
    assert not d.tls_enabled and not d.http_tls_on and not d.grpc_tls_on
    assert d.tls_min_version == "1.2" and d.tls_reload_interval_seconds == 10


def test_tls_applies_to_both_servers_unless_overridden(pki):
    d = deployment(pki)
    assert d.http_tls_on and d.grpc_tls_on
    d = deployment(pki, grpc_tls=False)
    assert d.http_tls_on and not d.grpc_tls_on
    d = deployment(pki, http_port=None)
    assert not d.http_tls_on and d.grpc_tls_on


@pytest.mark.parametrize("top, key", [
    ({"tls_cert_file": "/c.pem"}, "tls_key_file"),
    ({"tls_key_file": "/k.pem"}, "tls_cert_file"),
    ({"tls_key_env": "SP_TLS_KEY"}, "tls_cert_file"),
    ({"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem", "tls_key_env": "K"}, "tls_key_file"),
    ({"tls_client_ca_file": "/ca.pem"}, "tls_client_ca_file"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_require_client_cert": True}, "tls_require_client_cert"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_require_client_cert": "yes"}, "tls_require_client_cert"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_min_version": "1.1"}, "tls_min_version"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_min_version": "1.3"}, "tls_min_version"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "tls_reload_interval_seconds": -1}, "tls_reload_interval_seconds"),
    ({"http_plaintext_port": 8081}, "http_plaintext_port"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "grpc_tls": False, "grpc_plaintext_port": 8501},
     "grpc_plaintext_port"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "http_plaintext_port": 8080}, "http_plaintext_port"),
    ({"health_port": 70000}, "health_port"),
    ({"admin_client_cert": True}, "admin_client_cert"),
    ({"tls_cert_file": "/c", "tls_key_file": "/k", "admin_client_cert": True}, "admin_client_cert"),
    ({"admin_client_cert_names": ["ops"]}, "admin_client_cert_names"),
    ({"tls_certfile": "/c"}, "tls_certfile"),
])
def test_bad_keys_name_the_key(top, key):
    with pytest.raises(ConfigError) as exc:
        deployment(**top)
    assert exc.value.message.startswith(key), exc.value.message


def test_admin_client_cert_names_from_json(pki):
    d = deployment(pki, tls_client_ca_file=str(pki / "ca.crt"), admin_client_cert=True,
                   admin_client_cert_names=["ops", "spiffe://cluster/ns/ops"])
    assert d.admin_client_cert_names == ["ops", "spiffe://cluster/ns/ops"]


def test_tls_13_is_allowed_when_grpc_is_plaintext(pki):
    d = deployment(pki, tls_min_version="1.3", grpc_tls=False)
    assert tls.ssl_context(tls.load_material(d), d).minimum_version == ssl.TLSVersion.TLSv1_3


# --- the files ---------------------------------------------------------------------------------

def test_material_is_loaded_and_contexts_built(pki, ca):
    d = deployment(pki, tls_client_ca_file=str(pki / "ca.crt"), tls_require_client_cert=True)
    material = tls.load_material(d)
    assert material.subject == "CN=server" and material.client_ca == (pki / "ca.crt").read_bytes()
    ctx = tls.ssl_context(material, d)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    optional = deployment(pki, tls_client_ca_file=str(pki / "ca.crt"))
    assert tls.ssl_context(tls.load_material(optional), optional).verify_mode == ssl.CERT_OPTIONAL
    assert tls.grpc_server_credentials(tls.TlsCertificates(d)) is not None


def test_key_from_an_environment_variable(pki, monkeypatch):
    d = deployment(None, tls_cert_file=str(pki / "server.crt"), tls_key_env="SP_TEST_TLS_KEY")
    with pytest.raises(ConfigError, match=r"^tls_key_env: environment variable 'SP_TEST_TLS_KEY' is not set"):
        tls.load_material(d)
    monkeypatch.setenv("SP_TEST_TLS_KEY", (pki / "server.key").read_text())
    assert tls.load_material(d).key == (pki / "server.key").read_bytes()


def test_unreadable_files_name_the_key(pki):
    d = deployment(None, tls_cert_file=str(pki / "missing.crt"), tls_key_file=str(pki / "server.key"))
    with pytest.raises(ConfigError, match=r"^tls_cert_file: cannot read .*missing.crt"):
        tls.load_material(d)
    d = deployment(None, tls_cert_file=str(pki / "server.crt"), tls_key_file=str(pki))  # a directory
    with pytest.raises(ConfigError, match=r"^tls_key_file: cannot read"):
        tls.load_material(d)
    d = deployment(pki, tls_client_ca_file=str(pki / "nope.pem"))
    with pytest.raises(ConfigError, match=r"^tls_client_ca_file: cannot read"):
        tls.load_material(d)


def test_files_that_are_not_pem_name_the_key(pki):
    (pki / "junk").write_text("not a certificate\n")
    for key, message in (("tls_cert_file", "holds no PEM certificate"), ("tls_key_file", "no PEM private key"),
                         ("tls_client_ca_file", "holds no PEM certificate")):
        d = deployment(pki, **{"tls_client_ca_file": str(pki / "ca.crt"), key: str(pki / "junk")})
        with pytest.raises(ConfigError, match=rf"^{key}: .*{message}"):
            tls.load_material(d)


def test_key_not_matching_the_certificate(pki, ca):
    issue(ca, "other").write(pki / "other.crt", pki / "other.key")
    d = deployment(None, tls_cert_file=str(pki / "server.crt"), tls_key_file=str(pki / "other.key"))
    with pytest.raises(ConfigError, match=r"^tls_key_file: the private key does not match the certificate .*CN=server"):
        tls.load_material(d)


def test_encrypted_key_is_refused(pki):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key((pki / "server.key").read_bytes(), None)
    (pki / "enc.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.BestAvailableEncryption(b"secret")))
    d = deployment(None, tls_cert_file=str(pki / "server.crt"), tls_key_file=str(pki / "enc.key"))
    with pytest.raises(ConfigError, match=r"^tls_key_file: the private key is encrypted"):
        tls.load_material(d)


def test_expired_certificate_is_an_error_with_its_date(pki, ca):
    ended = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
    issue(ca, "old", not_after=ended).write(pki / "old.crt", pki / "old.key")
    d = deployment(None, tls_cert_file=str(pki / "old.crt"), tls_key_file=str(pki / "old.key"))
    with pytest.raises(ConfigError, match=rf"^tls_cert_file: the certificate CN=old expired on {ended:%Y-%m-%d}"):
        tls.load_material(d)


def test_certificate_expiring_soon_is_a_warning_with_its_date(pki, ca, caplog):
    soon = issue(ca, "soon", days=3)
    soon.write(pki / "soon.crt", pki / "soon.key")
    d = deployment(None, tls_cert_file=str(pki / "soon.crt"), tls_key_file=str(pki / "soon.key"))
    with caplog.at_level(logging.WARNING, logger="server.tls"):
        tls.load_material(d)
    date = f"{soon.cert.not_valid_after_utc:%Y-%m-%d}"
    assert any("expires on " + date in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="server.tls"):
        tls.load_material(deployment(pki))  # 30 days: quiet
    assert not caplog.records


# --- reload --------------------------------------------------------------------------------------

def _replace(pki, issued, name="server") -> None:
    """As the kubelet does: new files renamed over the old ones (new inodes)."""
    issued.write(pki / f"{name}.crt.new", pki / f"{name}.key.new")
    os.replace(pki / f"{name}.key.new", pki / f"{name}.key")
    os.replace(pki / f"{name}.crt.new", pki / f"{name}.crt")


def test_reload_publishes_a_changed_set_and_keeps_the_old_one_when_bad(pki, ca, caplog):
    d = deployment(pki, tls_reload_interval_seconds=0)
    certs = tls.TlsCertificates(d)
    seen = []
    certs.listeners.append(seen.append)
    assert not certs.check() and certs.generation == 0  # nothing changed
    _replace(pki, issue(ca, "rotated", hosts=LOCAL_HOSTS))
    assert certs.check() and certs.generation == 1
    assert certs.material.subject == "CN=rotated" and [m.subject for m in seen] == ["CN=rotated"]
    # a certificate whose key is not there yet (half-written set): logged, old set kept
    issue(ca, "half").write(pki / "server.crt")
    with caplog.at_level(logging.ERROR, logger="server.tls"):
        assert not certs.check()
    assert certs.material.subject == "CN=rotated"
    assert any("does not match" in r.getMessage() for r in caplog.records)
    assert not certs.check()  # reported once per change


def test_https_context_follows_reloads(pki, ca):
    d = deployment(pki, tls_reload_interval_seconds=0)
    certs = tls.TlsCertificates(d)
    https = tls.HttpsContext(certs)
    first = https.context
    _replace(pki, issue(ca, "rotated", hosts=LOCAL_HOSTS))
    certs.check()
    assert https._current is not first and https.context is first  # the listener's context stays


# --- admin gate ------------------------------------------------------------------------------------

def test_admin_gate_accepts_a_client_certificate_instead_of_the_token():
    from server.http.admin import AdminGate

    gate = AdminGate("a-long-token", cert_names=())
    assert gate.check("", "", ("any-client",)) is None
    assert gate.check("", "", None)[0] == 401  # no certificate: the token is needed
    assert gate.check("Bearer a-long-token", "", None) is None
    named = AdminGate(None, cert_names=("ops",))
    assert named.check("", "", ("ops", "ops.example")) is None
    status, message = named.check("", "", ("someone",))
    assert status == 403 and "admin_client_cert_names" in message
    assert AdminGate("a-long-token").check("", "", ("ops",))[0] == 401  # certificates do not count
