"""TF Serving's own end-to-end tests of its command line, against ``tensorflow_model_server`` (the
console script of this project, server/tfserving/cli.py) started with TF Serving's own command lines,
and the image's entry script (docker/tfserving-entrypoint.sh) serving ``half_plus_two``.

Ported from ``tensorflow_serving/model_servers/tensorflow_model_server_test.py`` and its base
``test_util/tensorflow_model_server_test_base.py`` (https://github.com/tensorflow/serving, Apache
License 2.0): the tests that need TF Serving's flags, which ``tests/e2e/test_tfserving_compat.py``
(one ``python -m server`` for every model) could not run: ``testBadModelConfig``,
``testModelConfigReload``, ``testModelConfigReloadWithZeroPollPeriod``,
``testGoodGrpcChannelArgs``, ``testPredictUDS``, and, through the flags this time,
``testGoodModelConfig``, ``testPrometheusEndpoint`` (``--monitoring_config_file``),
``testPredictSavedModel`` and ``testGetModelStatus`` (``--model_name`` / ``--model_base_path``);
``testPredictBatching`` (``--enable_batching --batching_parameters_file`` with TF Serving's
``batching_config.txt``) is TF Serving's test of that flag from before it dropped SessionBundles,
run on the SavedModel. Same requests, expected values and assertions, with the official
``tensorflow-serving-api`` stubs; the test data files (``good_model_config.txt``,
``bad_model_config.txt``, ``batching_config.txt``, ``monitoring_config.txt``) are TF Serving's,
verbatim, and the models are rebuilt as it builds them (``tests/models/half_plus_two.py``).

``RunServer`` builds TF Serving's command line, flag by flag as its base does (``--port``,
``--rest_api_port``, ``--rest_api_timeout_in_ms=5000``, ``--grpc_socket_path``, then
``--model_config_file`` or ``--model_name`` / ``--model_base_path``, ``--monitoring_config_file``,
``--model_config_file_poll_wait_seconds``, ``--enable_batching --batching_parameters_file``,
``--grpc_channel_arguments=...,grpc.so_reuseaddr=1``) and caches one server per set of
arguments. Adapted: free ports are found as portpicker finds them (a bind to port 0); the Unix
socket is one per server under the test's temporary directory, not ``/tmp/tf-serving.sock``
shared by every server; TF Serving's fixed ``time.sleep(10)`` after a config change waits until
the change shows instead (at most 60 s).

Ours, beyond TF Serving's: a malformed file written over a polled config leaves the running
models serving (the issue's requirement), ``--ssl_config_file`` (gRPC over TLS, with TF
Serving's SSLConfig of PEM strings), and the image's entry script with ``MODEL_NAME`` /
``MODEL_BASE_PATH`` on 8500 / 8501 (other ports, given as flags, where those are taken).
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from e2e.test_tfserving_compat import RPC_TIMEOUT, call_rest, verify_predict_request

ROOT = Path(__file__).resolve().parents[2]
HTTP_REST_TIMEOUT_MS = 5000
WAIT_FOR_SERVER_READY_INT_SECS = 60
BINARY = Path(sys.executable).with_name("tensorflow_model_server")

GOOD_MODEL_CONFIG = """model_config_list: {
  config: {
    name: "half_plus_two",
    base_path: "${TEST_HALF_PLUS_TWO_DIR}",
    model_platform: "tensorflow"
  },
  config: {
    name: "half_plus_three",
    base_path: "${TEST_HALF_PLUS_THREE_DIR}",
    model_platform: "tensorflow"
  }
}
"""
BAD_MODEL_CONFIG = "improperly formatted file"
BATCHING_CONFIG = """max_batch_size { value: 128 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 1000000 }
num_batch_threads { value: 8 }
"""
MONITORING_CONFIG = """prometheus_config: {
  enable: true,
  path: "/monitoring/prometheus/metrics"
}
"""
BASE_CONFIG_PROTO = """
    model_config_list: {{
      config: {{
        name: "{name}",
        base_path: "{model_path}",
        model_platform: "tensorflow"
      }}
    }}
    """

pytestmark = pytest.mark.timeout(900)


# --- TF Serving's test base, ported ---------------------------------------------------------------


def pick_unused_port() -> int:
    """``portpicker.pick_unused_port``: a port the kernel hands out free."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class Servers:
    """``RunServer``'s cache: one server per set of arguments, killed at the end."""

    def __init__(self, testdata: Path, workdir: Path) -> None:
        self.testdata, self.workdir = testdata, workdir
        self.running: dict[tuple, tuple] = {}

    def run(self, model_name, model_path, model_config_file=None, monitoring_config_file=None,
            batching_parameters_file=None, grpc_channel_arguments="", wait_for_server_ready=True,
            pipe=None, model_config_file_poll_period=None, extra=""):
        """``RunServer``: (Popen, grpc host:port, rest host:port, the Unix socket's path)."""
        key = (model_name, str(model_path), model_config_file, monitoring_config_file, batching_parameters_file,
               grpc_channel_arguments, pipe, model_config_file_poll_period, extra)
        if key in self.running:
            return self.running[key]
        port = pick_unused_port()
        rest_api_port = pick_unused_port()
        grpc_socket_path = self.workdir / f"tf-serving-{port}.sock"
        if not BINARY.exists():
            pytest.fail(f"{BINARY} is missing: scripts/setup.sh installs it (pip install -e .)")
        command = str(BINARY)
        command += " --port=" + str(port)
        command += " --rest_api_port=" + str(rest_api_port)
        command += " --rest_api_timeout_in_ms=" + str(HTTP_REST_TIMEOUT_MS)
        command += " --grpc_socket_path=" + str(grpc_socket_path)
        if model_config_file:
            command += " --model_config_file=" + str(model_config_file)
        elif model_path:
            command += " --model_name=" + model_name
            command += " --model_base_path=" + str(model_path)
        else:
            raise ValueError("Both model_config_file and model_path cannot be empty!")
        if monitoring_config_file:
            command += " --monitoring_config_file=" + str(monitoring_config_file)
        if model_config_file_poll_period is not None:
            command += " --model_config_file_poll_wait_seconds=" + str(model_config_file_poll_period)
        if batching_parameters_file:
            command += " --enable_batching"
            command += " --batching_parameters_file=" + str(batching_parameters_file)
        args_list = [arg for arg in [grpc_channel_arguments, "grpc.so_reuseaddr=1"] if arg]
        command += " --grpc_channel_arguments=" + ",".join(args_list)
        command += extra
        print(command)
        log = open(self.workdir / f"server-{port}.log", "wb")
        proc = subprocess.Popen(shlex.split(command), stdout=log, stderr=pipe or subprocess.STDOUT,
                                cwd=self.workdir, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        atexit.register(proc.kill)
        if wait_for_server_ready:
            wait_for_server_ready_(port, proc, self.workdir / f"server-{port}.log")
        hostports = (proc, f"localhost:{port}", f"localhost:{rest_api_port}", grpc_socket_path)
        self.running[key] = hostports
        return hostports

    def stop_all(self) -> None:
        for proc, *_ in self.running.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, *_ in self.running.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_for_server_ready_(port: int, proc: subprocess.Popen, log: Path) -> None:
    """``WaitForServerReady``: a Predict of a missing model until the error says "Servable"
    (here also: the server must not have exited, and must get there in time)."""
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "intentionally_missing_model"
    for _ in range(WAIT_FOR_SERVER_READY_INT_SECS * 2):
        time.sleep(0.5)
        assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text(errors='replace')[-4000:]}"
        try:
            with grpc.insecure_channel(f"localhost:{port}") as channel:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 5)
        except grpc.RpcError as error:
            if "Servable" in (error.details() or ""):
                return
    pytest.fail(f"server on {port} not ready:\n{log.read_text(errors='replace')[-4000:]}")


def wait_for(check, timeout: float = 60.0):
    """TF Serving sleeps a fixed time for a config change to show; here: until it shows."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (grpc.RpcError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def testdata(tmp_path_factory):
    """TF Serving's testdata directory: its models rebuilt, its config files verbatim."""
    pytest.importorskip("tensorflow", reason="TensorFlow builds TF Serving's test models and is not installed")
    from models.half_plus_two import export_tf1

    root = tmp_path_factory.mktemp("testdata")
    export_tf1(root / "saved_model_half_plus_two_cpu")
    export_tf1(root / "saved_model_half_plus_three", b=3.0)
    (root / "bad_model_config.txt").write_text(BAD_MODEL_CONFIG)
    (root / "batching_config.txt").write_text(BATCHING_CONFIG)
    (root / "monitoring_config.txt").write_text(MONITORING_CONFIG)
    (root / "good_model_config.txt").write_text(GOOD_MODEL_CONFIG)
    return root


@pytest.fixture(scope="module")
def servers(testdata, tmp_path_factory):
    running = Servers(testdata, tmp_path_factory.mktemp("servers"))
    yield running
    running.stop_all()


@pytest.fixture
def good_model_config_file(testdata, tmp_path):
    """``__BuildModelConfigFile``: the template with the test directories filled in."""
    config = (testdata / "good_model_config.txt").read_text().replace(
        "${TEST_HALF_PLUS_TWO_DIR}", str(testdata / "saved_model_half_plus_two_cpu")).replace(
        "${TEST_HALF_PLUS_THREE_DIR}", str(testdata / "saved_model_half_plus_three"))
    path = tmp_path / "good_model_config.conf"
    path.write_text(config)
    return path


def _half_plus_two(testdata):
    return testdata / "saved_model_half_plus_two_cpu"


def _half_plus_three(testdata):
    return testdata / "saved_model_half_plus_three"


def _version(model_path) -> int:
    """``_GetModelVersion``."""
    return int(os.listdir(model_path)[0])


# --- tensorflow_model_server_test.py ----------------------------------------------------------------


def test_testGetModelStatus(servers, testdata):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    model_server_address = servers.run("default", _half_plus_two(testdata))[1]
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "default"
    with grpc.insecure_channel(model_server_address) as channel:
        result = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, RPC_TIMEOUT)
    assert 1 == len(result.model_version_status)
    assert 123 == result.model_version_status[0].version
    assert 0 == result.model_version_status[0].status.error_code


def test_testPredictSavedModel(servers, testdata):
    """``_TestPredict(self._GetSavedModelBundlePath())``."""
    model_path = _half_plus_two(testdata)
    model_server_address = servers.run("default", model_path)[1]
    expected_version = _version(model_path)
    verify_predict_request(model_server_address, expected_output=3.0, expected_version=expected_version)
    verify_predict_request(model_server_address, expected_output=3.0, specify_output=False,
                           expected_version=expected_version)


def test_testPredictREST(servers, testdata):
    host, port = servers.run("default", _half_plus_two(testdata))[2].split(":")
    url = f"http://{host}:{port}/v1/models/default:predict"
    assert json.loads(call_rest(url, {"instances": [2.0, 3.0, 4.0]}).decode()) == {"predictions": [3.0, 3.5, 4.0]}


def test_testPredictBatching(servers, testdata):
    """``_TestPredict(model_path, batching_parameters_file=self._GetBatchingParametersFile())``."""
    model_path = _half_plus_two(testdata)
    model_server_address = servers.run("default", model_path,
                                       batching_parameters_file=testdata / "batching_config.txt")[1]
    expected_version = _version(model_path)
    verify_predict_request(model_server_address, expected_output=3.0, expected_version=expected_version)
    verify_predict_request(model_server_address, expected_output=3.0, specify_output=False,
                           expected_version=expected_version)
    # the file's parameters are the model's batching (model info)
    host, port = servers.run("default", model_path, batching_parameters_file=testdata / "batching_config.txt")[2] \
        .split(":")
    with urllib_open(f"http://{host}:{port}/api/models/default") as info:
        batching = json.loads(info.read())["config"]["batching"]
    assert (batching["max_batch_size"], batching["batch_timeout_micros"], batching["max_enqueued_batches"],
            batching["num_batch_threads"]) == (128, 0, 1000000, 8)


def test_testGoodModelConfig(servers, good_model_config_file, testdata):
    model_server_address = servers.run(None, None, model_config_file=good_model_config_file)[1]
    verify_predict_request(model_server_address, model_name="half_plus_two", expected_output=3.0,
                           expected_version=_version(_half_plus_two(testdata)))
    verify_predict_request(model_server_address, model_name="half_plus_two", expected_output=3.0,
                           specify_output=False, expected_version=_version(_half_plus_two(testdata)))
    verify_predict_request(model_server_address, model_name="half_plus_three", expected_output=4.0,
                           expected_version=_version(_half_plus_three(testdata)))
    verify_predict_request(model_server_address, model_name="half_plus_three", expected_output=4.0,
                           specify_output=False, expected_version=_version(_half_plus_three(testdata)))


def test_testBadModelConfig(servers, testdata):
    proc = servers.run(None, None, model_config_file=testdata / "bad_model_config.txt", pipe=subprocess.PIPE,
                       wait_for_server_ready=False)[0]
    error_message = "Error parsing text-format tensorflow.serving.ModelServerConfig"
    error_message = error_message.encode("utf-8")
    assert proc.stderr is not None
    assert proc.stderr.read().find(error_message) > -1
    assert proc.wait(60) != 0


def test_testModelConfigReload(servers, testdata, tmp_path):
    config_path = tmp_path / "model_config.txt"
    config_path.write_text(BASE_CONFIG_PROTO.format(name="half_plus_two", model_path=_half_plus_two(testdata)))
    poll_period = 1
    model_server_address = servers.run(None, None, model_config_file=config_path,
                                       model_config_file_poll_period=poll_period)[1]
    verify_predict_request(model_server_address, model_name="half_plus_two", expected_output=3.0,
                           specify_output=False, expected_version=_version(_half_plus_two(testdata)))

    config_path.write_text(BASE_CONFIG_PROTO.format(name="half_plus_three",
                                                    model_path=_half_plus_three(testdata)))
    wait_for(lambda: verify_predict_request(model_server_address, model_name="half_plus_three",
                                            expected_output=4.0, specify_output=False,
                                            expected_version=_version(_half_plus_three(testdata))))

    # ours: half_plus_two left the config, so it is gone; a malformed file then changes nothing
    with pytest.raises(grpc.RpcError) as gone:
        verify_predict_request(model_server_address, model_name="half_plus_two", expected_output=3.0,
                               expected_version=123)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    config_path.write_text(BAD_MODEL_CONFIG)
    time.sleep(poll_period * 3)
    verify_predict_request(model_server_address, model_name="half_plus_three", expected_output=4.0,
                           specify_output=False, expected_version=_version(_half_plus_three(testdata)))
    proc = servers.run(None, None, model_config_file=config_path, model_config_file_poll_period=poll_period)[0]
    log = (servers.workdir / f"server-{model_server_address.split(':')[1]}.log").read_text(errors="replace")
    assert "refused, the running models keep serving: Error parsing text-format " \
           "tensorflow.serving.ModelServerConfig" in log
    assert proc.poll() is None


def test_testModelConfigReloadWithZeroPollPeriod(servers, testdata, tmp_path):
    config_path = tmp_path / "model_config.txt"
    config_path.write_text(BASE_CONFIG_PROTO.format(name="half_plus_two", model_path=_half_plus_two(testdata)))
    poll_period = 0
    model_server_address = servers.run(None, None, model_config_file=config_path,
                                       model_config_file_poll_period=poll_period)[1]
    verify_predict_request(model_server_address, model_name="half_plus_two", expected_output=3.0,
                           specify_output=False, expected_version=_version(_half_plus_two(testdata)))

    config_path.write_text(BASE_CONFIG_PROTO.format(name="half_plus_three",
                                                    model_path=_half_plus_three(testdata)))
    time.sleep(poll_period + 1)
    verify_predict_request(model_server_address, model_name="half_plus_two", expected_output=3.0,
                           specify_output=False, expected_version=_version(_half_plus_three(testdata)))


def test_testGoodGrpcChannelArgs(servers, testdata):
    model_server_address = servers.run(
        "default", _half_plus_two(testdata),
        grpc_channel_arguments="grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb")[1]
    verify_predict_request(model_server_address, expected_output=3.0, specify_output=False,
                           expected_version=_version(_half_plus_three(testdata)))


def test_testPredictUDS(servers, testdata):
    grpc_socket_path = servers.run("default", _half_plus_two(testdata))[3]
    model_server_address = f"unix:{grpc_socket_path}"
    verify_predict_request(model_server_address, expected_output=3.0, specify_output=False,
                           expected_version=_version(_half_plus_three(testdata)))


def test_testPrometheusEndpoint(servers, testdata):
    host, port = servers.run("default", _half_plus_two(testdata),
                             monitoring_config_file=testdata / "monitoring_config.txt")[2].split(":")
    resp_data = call_rest(f"http://{host}:{port}/monitoring/prometheus/metrics", None)
    assert "# TYPE" in resp_data.decode("utf-8")


# --- ours -------------------------------------------------------------------------------------------


def test_ssl_config_file_serves_grpc_over_tls(servers, testdata, tmp_path):
    """``--ssl_config_file``: TF Serving's SSLConfig (PEM strings), gRPC over TLS with a client
    certificate required (``client_verify``); REST stays plaintext, as TF Serving's does."""
    pytest.importorskip("cryptography")
    from tools.dev_certs import issue, make_ca

    ca = make_ca()
    server_cert, client_cert = issue(ca, "localhost", hosts=("localhost",)), issue(ca, "client", client=True)
    ssl_config = tmp_path / "ssl_config.txt"
    ssl_config.write_text(f"server_key: {json.dumps(server_cert.key_pem.decode())}\n"
                          f"server_cert: {json.dumps(server_cert.cert_pem.decode())}\n"
                          f"custom_ca: {json.dumps(ca.cert_pem.decode())}\n"
                          f"client_verify: true\n")
    proc, address, rest, _ = servers.run("default", _half_plus_two(testdata), wait_for_server_ready=False,
                                         extra=f" --ssl_config_file={ssl_config}")
    credentials = grpc.ssl_channel_credentials(ca.cert_pem, client_cert.key_pem, client_cert.cert_pem)
    wait_for(lambda: _tls_predict(address, credentials), timeout=90)
    with pytest.raises(grpc.RpcError):  # no client certificate: refused in the handshake
        _tls_predict(address, grpc.ssl_channel_credentials(ca.cert_pem))
    host, port = rest.split(":")
    assert json.loads(call_rest(f"http://{host}:{port}/v1/models/default:predict",
                                {"instances": [2.0]}).decode()) == {"predictions": [3.0]}
    assert proc.poll() is None


def test_image_entry_script_serves_half_plus_two(testdata, tmp_path):
    """docker/tfserving-entrypoint.sh, as the image runs it (no Docker daemon needed): MODEL_NAME
    and MODEL_BASE_PATH pick the model (${MODEL_BASE_PATH}/${MODEL_NAME}, as tensorflow/serving's
    image), gRPC on 8500 and REST on 8501, or on ports given as flags where those are taken."""
    models = tmp_path / "models"
    shutil.copytree(_half_plus_two(testdata), models / "half_plus_two")
    ports = (8500, 8501)
    args = []
    if not all(_free(p) for p in ports):  # a test machine's own server: the flags move them
        ports = (pick_unused_port(), pick_unused_port())
        args = [f"--port={ports[0]}", f"--rest_api_port={ports[1]}"]
    env = {**os.environ, "MODEL_NAME": "half_plus_two", "MODEL_BASE_PATH": str(models),
           "PATH": f"{BINARY.parent}{os.pathsep}{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    log_path = tmp_path / "entry.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", str(ROOT / "docker" / "tfserving-entrypoint.sh"), *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    atexit.register(proc.kill)
    try:
        wait_for_server_ready_(ports[0], proc, log_path)
        verify_predict_request(f"localhost:{ports[0]}", model_name="half_plus_two", expected_output=3.0,
                               expected_version=123)
        url = f"http://localhost:{ports[1]}/v1/models/half_plus_two:predict"
        assert json.loads(call_rest(url, {"instances": [2.0, 3.0, 4.0]}).decode()) == {
            "predictions": [3.0, 3.5, 4.0]}
    finally:
        proc.terminate()  # exec'd: the server itself gets SIGTERM and drains
        assert proc.wait(60) == 0, log_path.read_text(errors="replace")[-3000:]


def _tls_predict(address: str, credentials) -> None:
    """A Predict of half_plus_two over TLS (``VerifyPredictRequest``'s request)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["x"].dtype = types_pb2.DT_FLOAT
    request.inputs["x"].float_val.append(2.0)
    request.inputs["x"].tensor_shape.dim.add().size = 1
    with grpc.secure_channel(address, credentials) as channel:
        result = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 10)
    assert list(result.outputs["y"].float_val) == [3.0]


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def urllib_open(url: str):
    import urllib.request

    return urllib.request.urlopen(url, timeout=RPC_TIMEOUT)
