"""Every ProcessorError code means the same on HTTP, gRPC and the C ABI (table-driven).

A fake model raises ``ProcessorError(code)`` when a request acquires it; the same request goes
through our HTTP endpoint, TF Serving REST, KServe v2 REST, our gRPC service, TF Serving gRPC,
KServe v2 gRPC (real uvicorn and grpc servers on 127.0.0.1) and ``processor.abi.process``; each
edge must report the code's meaning below (written out here, independently of
``STATUS_TABLE``) and the same message.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from fakes import FailingManager, fake_models, fake_processor
from processor import abi, codec
from server.settings import DeploymentConfig
from processor.errors import STATUS_TABLE, ProcessorError, StatusCode

CODES = [c for c in StatusCode if c != StatusCode.OK]

# code -> (HTTP status, gRPC status name, C ABI status)
MEANING = {
    StatusCode.INVALID_ARGUMENT: (400, "INVALID_ARGUMENT", 400),
    StatusCode.FAILED_PRECONDITION: (400, "FAILED_PRECONDITION", 400),  # TF Serving's missing signature
    StatusCode.NOT_FOUND: (404, "NOT_FOUND", 404),
    StatusCode.RESOURCE_EXHAUSTED: (413, "RESOURCE_EXHAUSTED", 400),  # processor.h has no 413
    StatusCode.INTERNAL: (500, "INTERNAL", 500),
    StatusCode.UNAVAILABLE: (503, "UNAVAILABLE", 503),
    StatusCode.DEADLINE_EXCEEDED: (504, "DEADLINE_EXCEEDED", 504),
}

REQUEST = codec.encode_request({"x": np.array([[1.0]], np.float32)})


def model_name(code: StatusCode) -> str:
    return code.name.lower()


@pytest.fixture(scope="module")
def server():
    from server.app import ServingApp

    deployment = DeploymentConfig.from_dict({
        "models": [{"name": model_name(c), "model_config": {"savedmodel_dir": "/nonexistent"}} for c in CODES],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False})
    managers = {model_name(c): FailingManager(model_name(c), c) for c in CODES}
    app = ServingApp(deployment, models=fake_models(deployment, managers), announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(30), "server did not start"
    channel = grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    yield app, channel
    channel.close()
    app.request_stop()
    thread.join(30)


def http_post(app, path: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{app.http_port}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def grpc_ours(channel, name: str) -> grpc.RpcError:
    from processor.proto import predict_pb2, processor_service_pb2_grpc

    stub = processor_service_pb2_grpc.ProcessorServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(predict_pb2.PredictRequest.FromString(REQUEST), metadata=[("model-name", name)], timeout=10)
    return info.value


def grpc_tfs(channel, name: str) -> grpc.RpcError:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
    with pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    return info.value


def grpc_v2(channel, name: str) -> grpc.RpcError:
    from processor.proto import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(1.0)
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(request.SerializeToString(), timeout=10)
    return info.value


def c_abi(code: StatusCode) -> tuple[int, bytes]:
    name = model_name(code)
    handle = fake_processor(name, FailingManager(name, code))
    return abi.process(handle, REQUEST)


def test_every_code_has_a_meaning():
    assert set(MEANING) == set(CODES), "a StatusCode was added: give it a meaning on every edge here"
    for code, (http, grpc_name, c) in MEANING.items():
        edge = STATUS_TABLE[code]
        assert (edge.http, edge.grpc, edge.c_abi) == (http, grpc_name, c)
        assert grpc_name in grpc.StatusCode.__members__


@pytest.mark.parametrize("code", CODES, ids=[c.name for c in CODES])
def test_code_means_the_same_on_every_edge(server, code):
    app, channel = server
    name = model_name(code)
    http, grpc_name, c_status = MEANING[code]
    message = FailingManager(name, code).message()

    status, body = http_post(app, f"/api/predict/{name}", REQUEST)
    assert (status, body) == (http, {"error": message})
    status, body = http_post(app, f"/v1/models/{name}:predict", b'{"instances": [[1.0]]}')
    assert (status, body) == (http, {"error": message})
    status, body = http_post(app, f"/v2/models/{name}/infer", json.dumps({"inputs": [
        {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode())
    assert (status, body) == (http, {"error": message})

    for err in (grpc_ours(channel, name), grpc_tfs(channel, name), grpc_v2(channel, name)):
        assert (err.code().name, err.details()) == (grpc_name, message)

    assert c_abi(code) == (c_status, message.encode())
