"""TLS and mutual TLS on both servers (issue 31), over real sockets, with certificates generated
here (``cryptography``, tools/dev_certs.py) and laid out as the kubelet mounts a Secret
(``..data`` symlink swapped atomically on update).

* ``python -m server`` on the toy model with TLS on its HTTP and gRPC ports: the official TF
  Serving stub (``PredictionServiceStub``), tritonclient gRPC and tritonclient HTTPS, and TF
  Serving REST over HTTPS get the right answers; plaintext clients to the TLS ports fail cleanly
  (and the server keeps serving); the migration plaintext ports and the health port serve what
  they should; admin endpoints let in a named client certificate instead of the token; rotating
  the Secret's files is picked up (the new certificate is presented on both ports) while
  clients keep sending, with no failed request.
* An in-process server (fake model) requiring client certificates: a client without one, or
  with one from another CA, is refused on both ports; one from the CA gets in. TLS 1.3 minimum
  refuses a TLS 1.2 client.
* Bad TLS files stop the server at start with a message naming the key (exit status 2).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

pytest.importorskip("cryptography")

from conftest import model_config  # noqa: E402
from tools.dev_certs import LOCAL_HOSTS, issue, make_ca  # noqa: E402

TOKEN = "tls-test-admin-token"
TOY_X = np.array([[1.0], [-2.0], [0.25]], np.float32)
TOY_Y = 0.5 * TOY_X + 2  # the toy model: y = 0.5 x + 2
ADMIN_NAME = "ops-client"


# --- certificates --------------------------------------------------------------------------------

def publish(secret: Path, version: str, files: dict[str, bytes]) -> None:
    """Write ``files`` as the kubelet updates a mounted Secret: a new ``..<version>`` directory,
    then the ``..data`` symlink renamed over the old one (one atomic switch for every file)."""
    target = secret / f"..{version}"
    target.mkdir(parents=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
        link = secret / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    tmp = secret / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, secret / "..data")


def server_files(server_cert, ca) -> dict[str, bytes]:
    return {"tls.crt": server_cert.cert_pem, "tls.key": server_cert.key_pem, "ca.crt": ca.cert_pem}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(), make_ca("another CA")
    secret = root / "secret"
    secret.mkdir()
    first = issue(ca, "serving-processor", hosts=LOCAL_HOSTS)
    publish(secret, "v1", server_files(first, ca))
    ca.write(root / "ca.crt")
    clients = {"admin": issue(ca, ADMIN_NAME, client=True), "other": issue(ca, "someone", client=True),
               "rogue": issue(other_ca, ADMIN_NAME, client=True)}  # the admin's name, another CA
    for name, cert in clients.items():
        cert.write(root / f"{name}.crt", root / f"{name}.key")
    return SimpleNamespace(root=root, ca=ca, secret=secret, ca_file=root / "ca.crt", first=first,
                           cert=lambda name: (str(root / f"{name}.crt"), str(root / f"{name}.key")))


def client_context(pki, cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    if cert is not None:
        ctx.load_cert_chain(*pki.cert(cert))
    return ctx


def grpc_credentials(pki, cert: str | None = None) -> grpc.ChannelCredentials:
    chain = key = None
    if cert is not None:
        chain, key = (Path(p).read_bytes() for p in pki.cert(cert))
    return grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), private_key=key, certificate_chain=chain)


def presented(port: int, pki, alpn: str | None = None) -> bytes:
    """The DER certificate the server presents on ``port`` to a new connection."""
    ctx = client_context(pki)
    if alpn:
        ctx.set_alpn_protocols([alpn])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as conn:
            return conn.getpeercert(binary_form=True)


def der(issued) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return issued.cert.public_bytes(serialization.Encoding.DER)


# --- the TF Serving wire -------------------------------------------------------------------------

def tfs_predict(channel: grpc.Channel, x: np.ndarray = TOY_X) -> np.ndarray:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "toy"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return tf.make_ndarray(response.outputs["y"])


def rest_predict(url: str, context: ssl.SSLContext | None = None, x: np.ndarray = TOY_X) -> np.ndarray:
    body = json.dumps({"instances": [{"x": row.tolist()} for row in x]}).encode()
    request = urllib.request.Request(f"{url}/v1/models/toy:predict", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30, context=context) as resp:
        return np.asarray(json.loads(resp.read())["predictions"], np.float32).reshape(x.shape)


def admin_reload(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{url}/admin/models/toy/reload", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


# --- the TLS server (python -m server, toy model) ---------------------------------------------------

@pytest.fixture(scope="module")
def server(pki, toy_model, tmp_path_factory):
    from tools.server_process import ServerProcess

    secret = pki.secret
    deployment = {
        "models": [{"name": "toy", "model_config": model_config(toy_model)}],
        "tls_cert_file": str(secret / "tls.crt"), "tls_key_file": str(secret / "tls.key"),
        "tls_client_ca_file": str(secret / "ca.crt"), "tls_reload_interval_seconds": 0.2,
        "admin_token": TOKEN, "admin_client_cert": True, "admin_client_cert_names": [ADMIN_NAME],
        "http_plaintext_port": 0, "grpc_plaintext_port": 0, "health_port": 0,
        "access_log": False, "drain_timeout_seconds": 10,
    }
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("tls-server"), ssl_context=client_context(pki))
    proc.start(timeout=180)
    assert proc.wait_models(90) == {"toy": "ready"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def tls_channel(server, pki):
    channel = grpc.secure_channel(server.grpc_target, grpc_credentials(pki))
    yield channel
    channel.close()


def test_tf_serving_stub_over_tls(tls_channel):
    np.testing.assert_allclose(tfs_predict(tls_channel), TOY_Y, rtol=1e-5, atol=1e-6)


def test_tf_serving_rest_over_https(server, pki):
    assert server.http.startswith("https://")
    np.testing.assert_allclose(rest_predict(server.http, client_context(pki)), TOY_Y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_tritonclient_over_tls(server, pki, transport):
    tritonclient = pytest.importorskip("tritonclient", reason="tritonclient is a dev dependency")  # noqa: F841
    if transport == "grpc":
        import tritonclient.grpc as module

        client = module.InferenceServerClient(server.grpc_target, ssl=True, root_certificates=str(pki.ca_file))
    else:
        import tritonclient.http as module

        client = module.InferenceServerClient(f"127.0.0.1:{server.http_port}", ssl=True,
                                              ssl_options={"ca_certs": str(pki.ca_file)})
    try:
        tensor = module.InferInput("x", list(TOY_X.shape), "FP32")
        tensor.set_data_from_numpy(TOY_X)
        result = client.infer("toy", [tensor])
        np.testing.assert_allclose(result.as_numpy("y"), TOY_Y, rtol=1e-5, atol=1e-6)
        assert client.is_server_ready()
    finally:
        client.close()


def test_plaintext_clients_to_tls_ports_fail_cleanly(server, pki, tls_channel):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    with pytest.raises((OSError, http.client.HTTPException)):  # the server closes: no answer
        conn.request("GET", "/readyz")
        conn.getresponse().read()
    conn.close()
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as exc:
        tfs_predict(channel)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    # a client that does not trust our CA refuses us (and we keep serving the others)
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(f"{server.http}/readyz", timeout=10, context=ssl.create_default_context())
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    assert server.get_json("/readyz")["ready"]
    np.testing.assert_allclose(tfs_predict(tls_channel), TOY_Y, rtol=1e-5, atol=1e-6)


def test_plaintext_migration_ports_and_the_health_port(server):
    plain = f"http://127.0.0.1:{server.ports['http_plaintext']}"
    np.testing.assert_allclose(rest_predict(plain), TOY_Y, rtol=1e-5, atol=1e-6)
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc_plaintext']}") as channel:
        np.testing.assert_allclose(tfs_predict(channel), TOY_Y, rtol=1e-5, atol=1e-6)
    health = f"http://127.0.0.1:{server.ports['health']}"
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
        with urllib.request.urlopen(health + path, timeout=10) as resp:
            assert resp.status == 200, path
    with urllib.request.urlopen(health + "/metrics", timeout=10) as resp:
        assert b"sp_requests_total" in resp.read()
    for path in ("/v1/models/toy", "/api/models", "/docs"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(health + path, timeout=10)
        assert exc.value.code == 404 and "health port" in json.loads(exc.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as exc:
        rest_predict(health)
    assert exc.value.code == 404


def test_admin_by_client_certificate_or_token(server, pki):
    assert admin_reload(server.http, client_context(pki, "admin")) == 200  # named certificate, no token
    assert admin_reload(server.http, client_context(pki)) == 401  # no certificate, no token
    assert admin_reload(server.http, client_context(pki, "other")) == 401  # a certificate not named
    assert admin_reload(server.http, client_context(pki, "other"), TOKEN) == 200
    plain = f"http://127.0.0.1:{server.ports['http_plaintext']}"
    assert admin_reload(plain) == 401 and admin_reload(plain, token=TOKEN) == 200
    with pytest.raises((OSError, http.client.HTTPException)):  # the admin's name from another CA
        admin_reload(server.http, client_context(pki, "rogue"))
    with urllib.request.urlopen(server.http + "/metrics", timeout=10, context=client_context(pki)) as resp:
        assert resp.status == 200  # /metrics needs neither


def test_rotated_certificate_is_presented_without_failed_requests(server, pki):
    """Clients keep sending over new and kept-open connections on both ports while the Secret's
    files are swapped; the new certificate is presented to new connections; nothing fails."""
    assert presented(server.http_port, pki) == der(pki.first)
    stop = threading.Event()
    done = {"new_https": 0, "keepalive_https": 0, "grpc": 0, "new_grpc": 0}
    failures: list[str] = []

    def loop(kind: str, call) -> None:
        while not stop.is_set():
            try:
                call()
                done[kind] += 1
            except Exception as exc:  # every failure is reported, none expected
                failures.append(f"{kind}: {type(exc).__name__}: {exc}")

    keepalive = http.client.HTTPSConnection("127.0.0.1", server.http_port, timeout=30, context=client_context(pki))

    def keepalive_call() -> None:
        keepalive.request("GET", "/v1/models/toy")
        resp = keepalive.getresponse()
        resp.read()
        assert resp.status == 200, resp.status

    channel = grpc.secure_channel(server.grpc_target, grpc_credentials(pki))

    def new_grpc_call() -> None:
        with grpc.secure_channel(server.grpc_target, grpc_credentials(pki)) as fresh:
            np.testing.assert_allclose(tfs_predict(fresh), TOY_Y, rtol=1e-5, atol=1e-6)

    calls = {
        "new_https": lambda: np.testing.assert_allclose(rest_predict(server.http, client_context(pki)), TOY_Y,
                                                        rtol=1e-5, atol=1e-6),
        "keepalive_https": keepalive_call,
        "grpc": lambda: np.testing.assert_allclose(tfs_predict(channel), TOY_Y, rtol=1e-5, atol=1e-6),
        "new_grpc": new_grpc_call,
    }
    threads = [threading.Thread(target=loop, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    try:
        while min(done.values()) < 3 and not failures:
            time.sleep(0.05)
        before = dict(done)
        rotated = issue(pki.ca, "serving-processor-rotated", hosts=LOCAL_HOSTS)
        publish(pki.secret, "v2", server_files(rotated, pki.ca))
        deadline = time.monotonic() + 60
        while not (presented(server.http_port, pki) == der(rotated)
                   and presented(server.grpc_port, pki, alpn="h2") == der(rotated)):
            assert time.monotonic() < deadline, f"the new certificate was not presented; log:\n{server.log()}"
            time.sleep(0.1)
        after = dict(done)
        while any(done[k] < after[k] + 3 for k in done) and not failures:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        keepalive.close()
        channel.close()
    assert not failures, failures[:5]
    assert all(done[k] > before[k] for k in done), (before, done)
    assert "TLS certificate reloaded" in server.log()


# --- mutual TLS required (in-process, fake model) -----------------------------------------------------

@contextlib.contextmanager
def in_process(pki, **top):
    """A ServingApp over the fake model ``m`` with TLS from ``pki``; yields it."""
    from fakes import FakeManager, fake_models
    from server.settings import DeploymentConfig
    from server.app import ServingApp

    secret = pki.secret
    deployment = DeploymentConfig.from_dict({
        "models": [{"name": "m", "model_config": {"savedmodel_dir": "/nonexistent"}}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False,
        "tls_cert_file": str(secret / "tls.crt"), "tls_key_file": str(secret / "tls.key"), **top})
    app = ServingApp(deployment, models=fake_models(deployment, {"m": FakeManager("m")}),
                     announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(30), "server did not start"
    try:
        yield app
    finally:
        app.request_stop()
        thread.join(30)


def health_check(port: int, credentials: grpc.ChannelCredentials) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca(pki):
    with in_process(pki, tls_client_ca_file=str(pki.ca_file), tls_require_client_cert=True) as app:
        url = f"https://127.0.0.1:{app.http_port}/readyz"
        for cert in (None, "rogue"):  # none, or one from another CA
            with pytest.raises((OSError, http.client.HTTPException)):
                urllib.request.urlopen(url, timeout=10, context=client_context(pki, cert)).read()
            with pytest.raises(grpc.RpcError) as exc:
                health_check(app.grpc_port, grpc_credentials(pki, cert))
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        with urllib.request.urlopen(url, timeout=10, context=client_context(pki, "other")) as resp:
            assert json.loads(resp.read())["ready"]
        assert health_check(app.grpc_port, grpc_credentials(pki, "other")) == "SERVING"


def test_minimum_version_13_refuses_a_tls12_client(pki):
    with in_process(pki, tls_min_version="1.3", grpc_port=None) as app:
        old = client_context(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(urllib.error.URLError) as refused:
            urllib.request.urlopen(f"https://127.0.0.1:{app.http_port}/healthz", timeout=10, context=old)
        assert isinstance(refused.value.reason, ssl.SSLError)  # the handshake failed
        with urllib.request.urlopen(f"https://127.0.0.1:{app.http_port}/healthz", timeout=10,
                                    context=client_context(pki)) as resp:
            assert resp.status == 200


# --- bad files at start -----------------------------------------------------------------------------

def test_bad_tls_files_stop_the_server_at_start_naming_the_key(pki, tmp_path):
    ended = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    expired = issue(pki.ca, "expired", hosts=LOCAL_HOSTS, not_after=ended)
    expired.write(tmp_path / "expired.crt", tmp_path / "expired.key")
    cases = {
        "expired": ({"tls_cert_file": str(tmp_path / "expired.crt"), "tls_key_file": str(tmp_path / "expired.key")},
                    f"tls_cert_file: the certificate CN=expired expired on {ended:%Y-%m-%d}"),
        "mismatch": ({"tls_cert_file": str(pki.secret / "tls.crt"), "tls_key_file": str(tmp_path / "expired.key")},
                     "tls_key_file: the private key does not match the certificate"),
        "unreadable": ({"tls_cert_file": str(tmp_path / "missing.crt"), "tls_key_file": str(tmp_path / "expired.key")},
                       "tls_cert_file: cannot read"),
    }
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name, (keys, message) in cases.items():
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/x"}}],
                                      "http_port": 0, "grpc_port": 0, **keys}))
        for extra in (["--check"], []):  # validation alone, and a real start
            out = subprocess.run([sys.executable, "-m", "server", "--config", str(config), *extra],
                                 capture_output=True, text=True, timeout=120, env=env)
            assert out.returncode == 2, (name, extra, out.stdout[-2000:], out.stderr[-2000:])
            assert f"bad config: {message}" in out.stderr, (name, extra, out.stderr[-2000:])
