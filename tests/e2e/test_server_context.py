"""A ranking request's context sent once, on every way in (issue 47): our wire format (HTTP and
gRPC), TF Serving REST (columnar) and gRPC Predict, KServe v2 (JSON, binary tensors, gRPC), and
``ExampleListWithContext`` in Classify / Regress / MultiInference (REST and gRPC). Every answer
is the tiled request's, on TensorFlow and ONNX Runtime, and the declared context part ran."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from processor import codec

pytest.importorskip("tensorflow")
tritonclient = pytest.importorskip("tritonclient", reason="tritonclient is a dev dependency (scripts/setup.sh)")
import tritonclient.grpc as tgrpc  # noqa: E402
import tritonclient.http as thttp  # noqa: E402
from test_server_kserve_v2 import infer_inputs  # noqa: E402

SMALL = dict(items=1000, dim=8, seq=10, profile=2, profile_rows=50, profile_dim=4, user_dense=3, item_dense=2,
             user_hidden=(16, 8), item_hidden=(8, 4), head_hidden=(8, 4))
SHAPES = dict(seq=10, profile=2, user_dense=3, item_dense=2)
MODELS = ("tt_tf", "tt_ort")
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from demo import two_tower
    from tools.server_process import ServerProcess

    path = two_tower.build(tmp_path_factory.mktemp("two_tower"), **SMALL)
    base = {"savedmodel_dir": str(path), "session_num": 1, "context_inputs": list(two_tower.USER_INPUTS),
            "context_cache": {"max_entries": 16}}
    deployment = {"models": [{"name": "tt_tf", "model_config": {**base, "backend": "tensorflow"}},
                             {"name": "tt_ort", "model_config": {**base, "backend": "onnxruntime"}}],
                  "access_log": False}
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("server")).start(timeout=240)
    states = proc.wait_models(180)
    assert set(states.values()) == {"ready"}, (states, proc.log())
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_target) as ch:
        yield ch


def feeds(candidates: int = 6):
    from demo import two_tower

    return two_tower.request(candidates, user=3, seed=candidates, **SHAPES)


def tiled(f):
    from demo import two_tower

    return two_tower.tiled(f)


def http(server, path: str, body: bytes, headers=None):
    req = urllib.request.Request(server.http + path, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def ours_http(server, model, inputs) -> np.ndarray:
    status, body = http(server, f"/api/predict/{model}", codec.encode_request(inputs))
    assert status == 200, body
    return codec.decode_response(body)["prob"]


def info(server, model) -> dict:
    with urllib.request.urlopen(server.http + f"/api/models/{model}", timeout=30) as resp:
        doc = json.loads(resp.read())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "context_once" in node and "context_part" in node:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(doc)
    assert found, doc
    return found[0]


@pytest.mark.parametrize("model", MODELS)
def test_our_wire_format(server, channel, model):
    from processor.proto import predict_pb2, processor_service_pb2_grpc

    f = feeds()
    want = ours_http(server, model, tiled(f))
    np.testing.assert_allclose(ours_http(server, model, f), want, **TOL)
    stub = processor_service_pb2_grpc.ProcessorServiceStub(channel)
    response = stub.Predict(predict_pb2.PredictRequest.FromString(codec.encode_request(f)),
                            metadata=[("model-name", model)], timeout=30)
    np.testing.assert_allclose(codec.decode_response(response.SerializeToString())["prob"], want, **TOL)


@pytest.mark.parametrize("model", MODELS)
def test_tf_serving_rest_and_grpc_predict(server, channel, model):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    f = feeds(5)
    want = ours_http(server, model, tiled(f))
    doc = {"inputs": {k: v.tolist() for k, v in f.items()}}  # columnar: the user's inputs one row each
    status, body = http(server, f"/v1/models/{model}:predict", json.dumps(doc).encode())
    assert status == 200, body
    np.testing.assert_allclose(np.array(json.loads(body)["outputs"], np.float32), want, **TOL)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, array in f.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(array))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    for _ in range(2):  # the second takes the prepared form
        got = tf.make_ndarray(stub.Predict(request, timeout=30).outputs["prob"])
        np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("model", MODELS)
def test_kserve_v2(server, model):
    f = feeds(7)
    want = ours_http(server, model, tiled(f))
    client = thttp.InferenceServerClient(server.http.removeprefix("http://"))
    for binary in (False, True, True):
        result = client.infer(model, infer_inputs(thttp, f, binary),
                              outputs=[thttp.InferRequestedOutput("prob", binary_data=binary)])
        np.testing.assert_allclose(result.as_numpy("prob"), want, **TOL)
    gclient = tgrpc.InferenceServerClient(server.grpc_target)
    for _ in range(2):
        np.testing.assert_allclose(gclient.infer(model, infer_inputs(tgrpc, f, True)).as_numpy("prob"), want, **TOL)


def _elwc(f):
    """An ExampleListWithContext: the user's features in the context, one example per candidate."""
    from tensorflow_serving.apis import input_pb2

    message = input_pb2.Input()
    listed = message.example_list_with_context
    for key in ("user_seq", "user_profile"):
        listed.context.features.feature[key].int64_list.value.extend(f[key][0].tolist())
    listed.context.features.feature["user_dense"].float_list.value.extend(f["user_dense"][0].tolist())
    for i in range(len(f["item_id"])):
        example = listed.examples.add()
        example.features.feature["item_id"].int64_list.value.append(int(f["item_id"][i]))
        example.features.feature["item_dense"].float_list.value.extend(f["item_dense"][i].tolist())
    return message


@pytest.mark.parametrize("model", MODELS)
def test_example_list_with_context(server, channel, model):
    from google.protobuf import json_format
    from tensorflow_serving.apis import (classification_pb2, inference_pb2, prediction_service_pb2_grpc,
                                         regression_pb2)

    f = feeds(4)
    want = ours_http(server, model, tiled(f)).ravel()
    before = info(server, model)["context_once"]
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = model
    regress.input.CopyFrom(_elwc(f))
    got = [r.value for r in stub.Regress(regress, timeout=30).result.regressions]
    np.testing.assert_allclose(got, want, **TOL)
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = model
    classify.input.CopyFrom(_elwc(f))
    got = [c.classes[0].score for c in stub.Classify(classify, timeout=30).result.classifications]
    np.testing.assert_allclose(got, want, **TOL)
    multi = inference_pb2.MultiInferenceRequest()
    task = multi.tasks.add()
    task.model_spec.name = model
    task.method_name = "tensorflow/serving/regress"
    multi.input.CopyFrom(_elwc(f))
    got = [r.value for r in stub.MultiInference(multi, timeout=30).results[0].regression_result.regressions]
    np.testing.assert_allclose(got, want, **TOL)
    # REST :regress, TF Serving's JSON form of the same ExampleListWithContext
    examples = json_format.MessageToDict(_elwc(f).example_list_with_context)
    doc = {"context": _json_example(examples["context"]), "examples": [_json_example(e) for e in examples["examples"]]}
    status, body = http(server, f"/v1/models/{model}:regress", json.dumps(doc).encode())
    assert status == 200, body
    np.testing.assert_allclose(json.loads(body)["results"], want, **TOL)
    assert info(server, model)["context_once"] == before + 4


def _json_example(example: dict) -> dict:
    """A tf.Example as TF Serving's REST API writes it: feature name -> list of values."""
    out = {}
    for name, feature in example["features"]["feature"].items():
        (kind, values), = feature.items()
        out[name] = [int(v) for v in values["value"]] if kind == "int64List" else values["value"]
    return out


@pytest.mark.parametrize("model", MODELS)
def test_refusals_are_clear_400s(server, model):
    f = tiled(feeds(6))
    f["item_dense"] = f["item_dense"][:1]
    status, body = http(server, f"/api/predict/{model}", codec.encode_request(f))
    assert status == 400 and b"input 'item_dense' has 1 row where the request's other inputs have 6" in body
    doc = {"inputs": {k: v.tolist() for k, v in f.items()}}
    status, body = http(server, f"/v1/models/{model}:predict", json.dumps(doc).encode())
    assert status == 400
    assert "context_inputs" in json.loads(body)["error"]


def test_metrics_count_the_context_and_its_cache(server):
    f = feeds(3)
    for _ in range(3):
        ours_http(server, "tt_tf", f)
    with urllib.request.urlopen(server.http + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("sp_context_")}
    assert lines['sp_context_requests_total{model="tt_tf",path="context_once"}'] >= 3
    assert lines['sp_context_cache_lookups_total{model="tt_tf",result="hit"}'] >= 2
    assert lines['sp_context_cache_bytes{model="tt_tf"}'] > 0
