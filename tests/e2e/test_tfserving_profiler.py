"""TensorFlow's profiler on the gRPC port (``tensorflow.ProfilerService``, server/tfserving/profiler.py):
TF Serving's own end-to-end test of it, against ``tensorflow_model_server`` started with TF
Serving's command line, and the answers where no trace can be taken.

``test_profiler_service_with_valid_trace_request`` is ported from
``tensorflow_serving/model_servers/tensorflow_model_server_test.py``
(https://github.com/tensorflow/serving, Apache License 2.0): the server started by its
``RunServer`` (``tests/e2e/test_tfserving_cli.py``'s port of it) serving ``half_plus_two``, REST
predictions sent every second for 3 seconds, and TensorFlow's own profiler client,
``profiler_client.trace(grpc_addr, logdir, 1000, '', 10)``, tracing the server meanwhile (it
raises when no trace was collected after its attempts). Adapted: the predictions are sent from a
thread with urllib, not by ``wget`` in a shell loop (not every test machine has ``wget``).
Ours, beyond it: the trace is where TensorBoard reads it (``<logdir>/plugins/profile/<run>/
<host>.xplane.pb``) and holds events; the public client
(``tf.profiler.experimental.client.trace('grpc://...')``, ``--enable_profiler=true`` given)
traces too, the model's ops in its trace; ``Monitor`` answers as TensorFlow's own server does
(UNIMPLEMENTED); the server still drains and exits 0 on SIGTERM; ``--enable_profiler=false``
and a server with no model on TensorFlow (ONNX Runtime only, ``python -m server`` with
``enable_profiler``) answer UNIMPLEMENTED saying why, and the ONNX-only one never loads
TensorFlow.
"""

from __future__ import annotations

import json
import threading
import urllib.request

import grpc
import pytest

from e2e.test_tfserving_cli import _half_plus_two, servers, testdata  # noqa: F401 - the fixtures

PROFILE = "/tensorflow.ProfilerService/Profile"

pytestmark = pytest.mark.timeout(900)


def _predict(url: str, answers: list, times: int, interval: float = 1.0) -> tuple[threading.Thread, threading.Event]:
    """A REST predict every ``interval`` seconds, ``times`` times or until the event returned is
    set (TF Serving's ``for n in {1..3}; do wget ... & sleep 1; done``: 3 times, a second apart)."""
    def send():
        for _ in range(times):
            request = urllib.request.Request(url, data=b'{"instances": [2.0, 3.0, 4.0]}',
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=20) as response:
                answers.append(json.loads(response.read()))
            if stop.wait(interval):
                return
    stop = threading.Event()
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, stop


def _traces(logdir) -> list:
    return sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))


def test_profiler_service_with_valid_trace_request(servers, testdata, tmp_path):
    """Test integration with profiler service by sending tracing requests."""
    from tensorflow.python.profiler import profiler_client

    # Start model server
    model_path = _half_plus_two(testdata)
    _, grpc_addr, rest_addr, _ = servers.run("default", model_path)

    # Prepare predict request
    url = "http://{}/v1/models/default:predict".format(rest_addr)
    answers: list = []
    # send a REST predict request every second for 3 seconds
    proc, _ = _predict(url, answers, 3)

    # Prepare args to ProfilerClient
    logdir = tmp_path / "logs"
    worker_list = ""
    duration_ms = 1000
    num_tracing_attempts = 10
    logdir.mkdir()

    # Send a tracing request
    profiler_client.trace(grpc_addr, str(logdir), duration_ms, worker_list, num_tracing_attempts)
    proc.join(60)
    assert answers == [{"predictions": [3.0, 3.5, 4.0]}] * 3

    # ours: one trace, where TensorBoard's profile plugin reads it, with events
    (trace,) = _traces(logdir)
    assert _event_names(trace), f"{trace} holds no event"


def test_the_public_client_traces_the_models_ops_and_monitor_answers_as_tensorflows_server(servers, testdata,
                                                                                          tmp_path):
    import tensorflow as tf

    proc, grpc_addr, rest_addr, _ = servers.run("default", _half_plus_two(testdata), extra=" --enable_profiler=true")
    answers: list = []
    sender, stop = _predict(f"http://{rest_addr}/v1/models/default:predict", answers, 1000, 0.05)
    try:
        tf.profiler.experimental.client.trace(f"grpc://{grpc_addr}", str(tmp_path), 1000, num_tracing_attempts=10)
    finally:
        stop.set()
        sender.join(60)
    assert answers and all(a == {"predictions": [3.0, 3.5, 4.0]} for a in answers)
    (trace,) = _traces(tmp_path)
    # half_plus_two's graph (y = a * x + b) as the server's TensorFlow session ran it
    assert {"SessionRun", "Mul:Mul", "Add:AddV2"} <= _event_names(trace)
    with pytest.raises(Exception, match="UNIMPLEMENTED"):  # TensorFlow's service has no Monitor
        tf.profiler.experimental.client.monitor(f"grpc://{grpc_addr}", 100)
    proc.terminate()  # TensorFlow's profiler server running in it does not hold up the drain
    assert proc.wait(60) == 0


def test_enable_profiler_false_answers_unimplemented(servers, testdata):
    _, grpc_addr, _, _ = servers.run("default", _half_plus_two(testdata), extra=" --enable_profiler=false")
    error = _raw_profile(grpc_addr)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED and "enable_profiler" in error.details()


def test_an_onnx_only_server_answers_unimplemented_and_never_loads_tensorflow(tmp_path):
    from demo import dlrm_onnx
    from e2e.test_server_without_tensorflow import loaded_tensorflow
    from tools.server_process import ServerProcess

    dlrm_onnx.build(tmp_path / "model" / "model.onnx", rows=50, dim=4)
    config = {"savedmodel_dir": str(tmp_path / "model"), "backend": "onnxruntime", "session_num": 1}
    deployment = {"models": [{"name": "dlrm", "model_config": config}], "enable_profiler": True}
    with ServerProcess(deployment, tmp_path / "server") as server:
        error = _raw_profile(server.grpc_target)
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "no model serves on TensorFlow" in error.details(), error.details()
        assert loaded_tensorflow(server.proc.pid) == []


def _raw_profile(target: str) -> grpc.RpcError:
    """The error a Profile call (an empty ProfileRequest, raw bytes) gets."""
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(PROFILE)(b"", timeout=30)
    return info.value


def _event_names(trace) -> set[str]:
    """The names of the events a trace file (an XSpace) holds."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace.FromString(trace.read_bytes())
    return {plane.event_metadata[event.metadata_id].name
            for plane in space.planes for line in plane.lines for event in line.events}
