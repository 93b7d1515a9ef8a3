"""TLS and mutual TLS on the native gRPC server (issue 50, ``grpc_server: "native"``), with the
certificates and helpers of tests/e2e/test_server_tls.py (the Python server's TLS tests):

* ``python -m server`` on the DLRM-like ``.onnx`` model with batching (our Predict on the native
  direct path) with TLS on its gRPC port: Predict and health over TLS answer what the plaintext
  migration port answers; a plaintext client to the TLS port fails cleanly; rotating the Secret's
  files is picked up (the new certificate is presented to new connections) while a client keeps
  sending, with no failed request;
* an in-process server (fake model) requiring client certificates: a client without one, or with
  one from another CA, is refused; one from the CA gets in.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

pytest.importorskip("cryptography")
pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built (libgrpc++-dev missing)")

from processor import codec  # noqa: E402
from test_server_tls import (der, grpc_credentials, health_check, in_process, pki, presented,  # noqa: E402,F401
                             publish, server_files)
from tools.dev_certs import LOCAL_HOSTS, issue  # noqa: E402

PREDICT = "/tensorflow.eas.ProcessorService/Predict"


@pytest.fixture(scope="module")
def server(pki, tmp_path_factory):  # noqa: F811 - pki: the imported fixture
    from demo import dlrm_onnx
    from tools.server_process import ServerProcess

    model = tmp_path_factory.mktemp("dlrm") / "model.onnx"
    dlrm_onnx.build(model, rows=1000, dim=8)
    secret = pki.secret
    config = {"savedmodel_dir": str(model.parent), "backend": "onnxruntime", "session_num": 1,
              "batching": {"max_batch_size": 64, "batch_timeout_micros": 1000, "num_batch_threads": 1}}
    deployment = {
        "models": [{"name": "b", "model_config": config}], "grpc_server": "native",
        "tls_cert_file": str(secret / "tls.crt"), "tls_key_file": str(secret / "tls.key"),
        "tls_client_ca_file": str(secret / "ca.crt"), "tls_reload_interval_seconds": 0.2,
        "grpc_plaintext_port": 0, "http_tls": False, "access_log": False, "drain_timeout_seconds": 5,
    }
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("native-tls")).start(timeout=180)
    assert proc.wait_models(90) == {"b": "ready"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


def body() -> bytes:
    from demo import dlrm_onnx

    return codec.encode_request(dlrm_onnx.inputs(3, seed=7))


def predict(channel: grpc.Channel) -> bytes:
    return channel.unary_unary(PREDICT)(body(), metadata=[("model-name", "b")])  # no deadline: the direct path


def test_predict_and_health_over_tls(server, pki):  # noqa: F811
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc_plaintext']}") as plain:
        expected = predict(plain)
    with grpc.secure_channel(server.grpc_target, grpc_credentials(pki)) as channel:
        assert predict(channel) == expected
    assert health_check(server.grpc_port, grpc_credentials(pki)) == "SERVING"


def test_a_plaintext_client_to_the_tls_port_fails_cleanly(server, pki):  # noqa: F811
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as exc:
        predict(channel)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(server.grpc_target, grpc_credentials(pki)) as channel:
        assert predict(channel)


def test_a_rotated_certificate_is_presented_without_failed_requests(server, pki):  # noqa: F811
    assert presented(server.grpc_port, pki, alpn="h2") == der(pki.first)
    stop = threading.Event()
    done, failures = [0], []
    channel = grpc.secure_channel(server.grpc_target, grpc_credentials(pki))

    def loop() -> None:
        while not stop.is_set():
            try:
                predict(channel)
                with grpc.secure_channel(server.grpc_target, grpc_credentials(pki)) as fresh:
                    predict(fresh)
                done[0] += 1
            except Exception as exc:  # every failure is reported, none expected
                failures.append(f"{type(exc).__name__}: {exc}")
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        rotated = issue(pki.ca, "serving-processor-rotated", hosts=LOCAL_HOSTS)
        publish(pki.secret, "v2", server_files(rotated, pki.ca))
        deadline = time.monotonic() + 60
        while presented(server.grpc_port, pki, alpn="h2") != der(rotated):
            assert time.monotonic() < deadline, f"the new certificate was not presented; log:\n{server.log()}"
            time.sleep(0.1)
        seen = done[0]
        while done[0] < seen + 3 and not failures:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(60)
        channel.close()
    assert not failures, failures[:5]


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca(pki):  # noqa: F811
    with in_process(pki, tls_client_ca_file=str(pki.ca_file), tls_require_client_cert=True,
                    grpc_server="native") as app:
        for cert in (None, "rogue"):  # none, or one from another CA
            with pytest.raises(grpc.RpcError) as exc:
                health_check(app.grpc_port, grpc_credentials(pki, cert))
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert health_check(app.grpc_port, grpc_credentials(pki, "other")) == "SERVING"
