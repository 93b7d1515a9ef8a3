"""An ONNX-only server never loads TensorFlow (issue 24: memory per worker).

TensorFlow costs every server process ~230 MiB of private memory; TF Serving's APIs used to
import it through ``tensorflow_serving.apis``' protocol buffers (they are built without it now:
``server/tfserving/messages.py``). A real server (``python -m server``, 2 workers) serves the DLRM-like
``.onnx`` model on ONNX Runtime; TF Serving's own client stubs call Predict, GetModelMetadata and
GetModelStatus over its gRPC port on fresh channels, and TF Serving's REST metadata on fresh
connections, until both workers have answered each; then
no process of the server (supervisor, workers) has TensorFlow's library mapped
(``/proc/<pid>/maps``: ``tensorflow/__init__.py`` loads ``libtensorflow_framework.so``, and any
TensorFlow pb2 import runs it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from demo import dlrm_onnx

RPC_TIMEOUT = 30.0
CALLS = [("grpc", "tfs_predict"), ("grpc", "tfs_metadata"), ("grpc", "tfs_status"), ("http", "tfs_metadata")]


def loaded_tensorflow(pid: int) -> list[str]:
    """The TensorFlow libraries mapped into process ``pid``."""
    paths = {line.split(maxsplit=5)[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
             if line.count(" ") >= 5}
    return sorted(p for p in paths if "libtensorflow" in Path(p).name or "_pywrap_tensorflow" in p)


def worker_of_each_call(log: str) -> dict[tuple[str, str], set[int]]:
    """(protocol, api) -> the workers whose access-log lines show they answered it."""
    seen: dict[tuple[str, str], set[int]] = {}
    for line in log.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if "api" in entry and "worker" in entry:
                seen.setdefault((entry["protocol"], entry["api"]), set()).add(entry["worker"])
    return seen


@pytest.mark.timeout(300)
def test_an_onnx_only_server_answers_tf_serving_grpc_and_no_process_loads_tensorflow(tmp_path):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                         predict_pb2, prediction_service_pb2_grpc)

    from sp_checks import wait_for
    from tools.server_process import ServerProcess

    # the check sees TensorFlow where it is: in this process, which imported it
    assert loaded_tensorflow(os.getpid())
    dlrm_onnx.build(tmp_path / "model" / "model.onnx", rows=500, dim=8)
    config = {"savedmodel_dir": str(tmp_path / "model"), "backend": "onnxruntime", "session_num": 1}
    deployment = {"models": [{"name": "dlrm", "model_config": config}], "workers": 2, "access_log": True}
    inputs = dlrm_onnx.inputs(3)
    with ServerProcess(deployment, tmp_path / "server") as server:
        processes = [server.proc.pid, *server.ports["workers"]]
        predict = predict_pb2.PredictRequest()
        predict.model_spec.name = "dlrm"
        for key, array in inputs.items():
            predict.inputs[key].CopyFrom(tf.make_tensor_proto(array))
        metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        metadata.model_spec.name = "dlrm"
        status = get_model_status_pb2.GetModelStatusRequest()
        status.model_spec.name = "dlrm"
        answers, rest = [], []

        def call_on_a_fresh_channel() -> bool:
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                answers.append((stub.Predict(predict, RPC_TIMEOUT), stub.GetModelMetadata(metadata, RPC_TIMEOUT),
                                model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status, RPC_TIMEOUT)))
            rest.append(server.get_json("/v1/models/dlrm/metadata"))  # a new connection each call
            seen = worker_of_each_call(server.log())
            return all(seen.get(call, set()) >= set(server.ports["workers"]) for call in CALLS)

        assert wait_for(call_on_a_fresh_channel, 120), \
            f"not every worker answered each call: {worker_of_each_call(server.log())}"
        for prediction, meta, model_status in answers:
            [output] = prediction.outputs
            assert tf.make_ndarray(prediction.outputs[output]).shape == (3, 1)
            np.testing.assert_allclose(tf.make_ndarray(prediction.outputs[output]),
                                       tf.make_ndarray(answers[0][0].outputs[output]), rtol=1e-6)
            signatures = get_model_metadata_pb2.SignatureDefMap()
            assert meta.metadata["signature_def"].Unpack(signatures)
            assert set(signatures.signature_def["serving_default"].inputs) == set(inputs)
            [version] = model_status.model_version_status
            assert version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        for answer in rest:
            assert set(answer["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]) == set(inputs)
        assert {pid: loaded_tensorflow(pid) for pid in processes} == {pid: [] for pid in processes}
        assert server.stop() == 0
