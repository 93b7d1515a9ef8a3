"""Prediction logging over every edge, read back with TensorFlow.

A real server (the toy model y = 0.5x + 2, ``logging_config`` at rate 1) answers one request
over each way in: our HTTP and gRPC wire format, TF Serving's REST and gRPC APIs, the Open
Inference Protocol over HTTP and gRPC, and a request the model refuses; SIGTERM then drains it,
which must close the log file. The records, read with ``tf.data.TFRecordDataset`` and
``tensorflow_serving.apis.prediction_log_pb2``, hold exactly the inputs sent and the outputs
served, under the request id each call carried. The C ABI (the example C++ host, its own
embedded interpreter, ``finalize`` at exit) logs the same way. Metrics and model info report
the counts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from conftest import model_config
from processor import codec

REPO = Path(__file__).resolve().parents[2]
HOST = REPO / "cpp_processor" / "build" / "processor_host"
tf = pytest.importorskip("tensorflow")
prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")


def read_log(directory: Path) -> dict[str, object]:
    """Every record of the closed ``*.tfrecord`` files, by request id (TensorFlow's reader)."""
    files = sorted(str(p) for p in directory.glob("*.tfrecord"))
    out = {}
    for raw in tf.data.TFRecordDataset(files):
        entry = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
        ours = _ours(raw.numpy())
        out[ours.log_metadata.request_id] = (entry, ours)
    return out


def _ours(raw: bytes):
    from processor.prediction_log.proto import PredictionLog

    return PredictionLog.FromString(raw)  # also reads our fields (request id, error)


def tensors(tensor_map) -> dict[str, np.ndarray]:
    return {key: tf.make_ndarray(value) for key, value in tensor_map.items()}


def post(url: str, body: bytes, request_id: str, content_type: str = "application/json") -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"X-Request-ID": request_id,
                                                             "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def send_every_edge(server) -> dict[str, float]:
    """One request per way in, each with its own x and request id; returns x by request id."""
    from tensorflow_serving.apis import predict_pb2 as tfs_predict_pb2
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from processor.proto import (grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc, predict_pb2,
                                 processor_service_pb2_grpc)

    sent = {"http-ours": 1.0, "http-tfs": 2.0, "http-v2": 3.0, "grpc-ours": 4.0, "grpc-tfs": 5.0, "grpc-v2": 6.0}
    wire = codec.encode_request({"x": np.array([[1.0]], np.float32)})
    assert post(server.http + "/api/predict/toy", wire, "http-ours", "application/octet-stream")[0] == 200
    assert post(server.http + "/v1/models/toy:predict", b'{"instances": [[2.0]]}', "http-tfs")[0] == 200
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]}
    assert post(server.http + "/v2/models/toy/infer", json.dumps(body).encode(), "http-v2")[0] == 200
    status, raw = post(server.http + "/v1/models/toy:predict", b'{"instances": [["a"]]}', "http-bad")
    assert status == 400, raw

    with grpc.insecure_channel(server.grpc_target) as channel:
        ours = processor_service_pb2_grpc.ProcessorServiceStub(channel)
        request = predict_pb2.PredictRequest.FromString(codec.encode_request({"x": np.array([[4.0]], np.float32)}))
        ours.Predict(request, metadata=[("model-name", "toy"), ("x-request-id", "grpc-ours")], timeout=30)
        tfs = tfs_predict_pb2.PredictRequest()
        tfs.model_spec.name = "toy"
        tfs.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[5.0]], np.float32)))
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            tfs, metadata=[("x-request-id", "grpc-tfs")], timeout=30)
        v2 = grpc_predict_v2_pb2.ModelInferRequest(model_name="toy")
        tensor = v2.inputs.add(name="x", datatype="FP32", shape=[1, 1])
        tensor.contents.fp32_contents.append(6.0)
        grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            v2, metadata=[("x-request-id", "grpc-v2")], timeout=30)
    return sent


@pytest.mark.timeout(300)
def test_every_edge_logs_what_it_sent_and_served_and_sigterm_flushes(toy_model, tmp_path):
    from tools.server_process import ServerProcess

    logs = tmp_path / "logs"
    config = model_config(toy_model, logging_config={"sampling_rate": 1.0, "path": str(logs)})
    deployment = {"models": [{"name": "toy", "model_config": config}], "drain_timeout_seconds": 10,
                  "access_log": False}
    server = ServerProcess(deployment, tmp_path).start(timeout=180)
    try:
        sent = send_every_edge(server)
        info = server.get_json("/api/models/toy")["prediction_log"]
        assert info["write_errors"] == 0 and info["path"] == str(logs)
        with urllib.request.urlopen(server.http + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert re.search(r'^sp_prediction_log_records_total\{model="toy",outcome="dropped"\} 0\.0$', metrics, re.M)
        assert server.stop(timeout=60) == 0, server.log()  # SIGTERM: drain, close the models
    finally:
        server.kill()

    assert not [p for p in os.listdir(logs) if p.endswith(".tmp")]  # the open file was closed
    records = read_log(logs)
    assert set(records) == set(sent) | {"http-bad"}, sorted(records)
    for request_id, x in sent.items():
        entry, ours = records[request_id]
        spec = entry.log_metadata.model_spec
        assert (spec.name, spec.signature_name, spec.version.value) == ("toy", "serving_default", 1)
        assert entry.log_metadata.sampling_config.sampling_rate == 1.0 and not ours.log_metadata.error_code
        inputs = tensors(entry.predict_log.request.inputs)
        outputs = tensors(entry.predict_log.response.outputs)
        np.testing.assert_array_equal(inputs["x"], np.array([[x]], np.float32), err_msg=request_id)
        np.testing.assert_allclose(outputs["y"], [[0.5 * x + 2]], rtol=1e-5, atol=1e-6, err_msg=request_id)
    entry, ours = records["http-bad"]
    assert not entry.predict_log.HasField("response")
    assert ours.log_metadata.error_code == "INVALID_ARGUMENT" and "x" in ours.log_metadata.error_message


@pytest.mark.timeout(300)
@pytest.mark.skipif(not HOST.exists(), reason="the example C host is built by scripts/setup.sh")
def test_c_abi_logs_the_same_way(toy_model, tmp_path):
    logs = tmp_path / "logs"
    config = model_config(toy_model, logging_config={"sampling_rate": 1.0, "path": str(logs), "format": "jsonl"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "request.pb").write_bytes(codec.encode_request({"x": np.array([[1.0], [3.0]], np.float32)}))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for key in ("PYTHONMALLOC", "LD_PRELOAD"):
        env.pop(key, None)
    proc = subprocess.run([str(HOST), "--config", str(tmp_path / "config.json"), "--request",
                           str(tmp_path / "request.pb"), "--threads", "2", "--calls", "5"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for p in sorted(logs.glob("*.jsonl")) for line in p.read_text().splitlines()]
    # the host's first call (its reference answer) and 2 threads x 5 calls; finalize closed the file
    assert len(lines) == 11 and not list(logs.glob("*.tmp"))
    for line in lines:
        assert line["model"] == "default" and line["version"] == 1 and line["request_id"]
        assert line["inputs"]["x"] == {"dtype": "DT_FLOAT", "shape": [2, 1], "values": [[1.0], [3.0]]}
        np.testing.assert_allclose(line["outputs"]["y"]["values"], [[2.5], [3.5]], rtol=1e-5, atol=1e-6)
