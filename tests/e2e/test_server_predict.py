"""The server over real sockets: a three-model deployment (toy, demo CTR, one with missing files)
started with ``python -m server`` on 127.0.0.1 ports.

Predictions over our HTTP, TF Serving REST (row and columnar), our gRPC and TF Serving gRPC (the
``tensorflow-serving-api`` stubs) equal ``process()``; models are routed by name; the broken model
is unready while the others serve; bad input gets a 4xx ``{"error"}`` and the server keeps
serving; size limits, status/metadata, probes, metrics, OpenAPI, request ids, admin.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import model_config
from processor import codec
from sp_checks import assert_outputs_close, set_model_spec

ADMIN_TOKEN = "test-admin-token"
LIMIT = 1 << 20  # max_request_bytes
TOY_X = {"x": np.array([[1.0], [-2.0], [0.25]], np.float32)}


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(toy_model, ctr_model_small, tmp_path_factory):
    from tools.server_process import ServerProcess

    work = tmp_path_factory.mktemp("server")
    deployment = {
        "models": [
            {"name": "toy", "model_config": model_config(toy_model), "version_labels": {"stable": 1}},
            {"name": "demo", "model_config": model_config(ctr_model_small, session_num=2)},
            {"name": "broken", "model_config": model_config(toy_model, savedmodel_dir=str(work / "missing"))},
        ],
        "max_request_bytes": LIMIT, "admin_token": ADMIN_TOKEN, "drain_timeout_seconds": 10,
        "access_log": False,
    }
    proc = ServerProcess(deployment, work).start(timeout=180)
    assert proc.wait_models(60) == {"toy": "ready", "demo": "ready", "broken": "failed"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.grpc_target)
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def reference(toy_model, ctr_model_small):
    """process() of the same models, in this process."""
    import json as _json

    from processor.processor import Processor

    made = {"toy": Processor.create("toy", _json.dumps(model_config(toy_model))),
            "demo": Processor.create("demo", _json.dumps(model_config(ctr_model_small)))}
    yield made
    for p in made.values():
        p.close()


def demo_inputs(n: int = 8, seed: int = 3) -> dict[str, np.ndarray]:
    from demo.synthetic_data import synthetic_batch

    return synthetic_batch(n, seed)


INPUTS = {"toy": lambda: TOY_X, "demo": demo_inputs}


# --- clients ------------------------------------------------------------------------------------

def call(server, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(server.http + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def call_json(server, method: str, path: str, doc=None, raw: bytes | None = None, **kw):
    body = raw if raw is not None else (json.dumps(doc).encode() if doc is not None else None)
    status, _, data = call(server, method, path, body, **kw)
    return status, json.loads(data)


def jsonable(array: np.ndarray):
    if array.dtype == object:
        return np.vectorize(lambda b: b.decode(), otypes=[object])(array).tolist()
    return array.tolist()


def as_arrays(outputs: dict, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=like[k].dtype) for k, v in outputs.items()}


def rest_rows(server, name: str, inputs: dict[str, np.ndarray]) -> list:
    n = len(next(iter(inputs.values())))
    rows = [{k: jsonable(v[i]) for k, v in inputs.items()} for i in range(n)]
    status, body = call_json(server, "POST", f"/v1/models/{name}:predict", {"instances": rows})
    assert status == 200, body
    return body["predictions"]


def rest_columns(server, name: str, inputs: dict[str, np.ndarray]):
    status, body = call_json(server, "POST", f"/v1/models/{name}:predict",
                             {"inputs": {k: jsonable(v) for k, v in inputs.items()}})
    assert status == 200, body
    return body["outputs"]


def ours_http(server, name: str, inputs) -> dict[str, np.ndarray]:
    status, headers, body = call(server, "POST", f"/api/predict/{name}", codec.encode_request(inputs))
    assert status == 200 and headers["content-type"] == "application/x-protobuf", body
    return codec.decode_response(body)


def ours_grpc(channel, name: str, inputs) -> dict[str, np.ndarray]:
    from processor.proto import predict_pb2, processor_service_pb2_grpc

    stub = processor_service_pb2_grpc.ProcessorServiceStub(channel)
    request = predict_pb2.PredictRequest.FromString(codec.encode_request(inputs))
    response = stub.Predict(request, metadata=[("model-name", name)], timeout=30)
    return codec.decode_response(response.SerializeToString())


def tfs_request(name: str, inputs, **spec):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    set_model_spec(request.model_spec, name, **spec)
    for key, array in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(array))
    return request


def tfs_grpc(channel, name: str, inputs, **spec):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(tfs_request(name, inputs, **spec), timeout=30)
    return response, {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def grpc_error(fn, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kw)
    return info.value


# --- predictions equal process() ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["toy", "demo"])
def test_every_transport_equals_process(server, channel, reference, name):
    inputs = INPUTS[name]()
    status, body = reference[name].process(codec.encode_request(inputs))
    assert status == 200
    expected = codec.decode_response(body)
    assert expected

    def same(got: dict[str, np.ndarray], how: str) -> None:
        # the server runs the model in its own process with its own thread settings
        assert_outputs_close(got, expected, how)

    same(ours_http(server, name, inputs), "our HTTP")
    same(ours_grpc(channel, name, inputs), "our gRPC")
    response, arrays = tfs_grpc(channel, name, inputs)
    same(arrays, "TF Serving gRPC")
    assert response.model_spec.name == name and response.model_spec.signature_name == "serving_default"

    rows = rest_rows(server, name, inputs)
    if len(expected) == 1:
        (key,) = expected
        rows = [{key: r} for r in rows]
    same(as_arrays({k: [r[k] for r in rows] for k in expected}, expected), "TF Serving REST rows")
    columns = rest_columns(server, name, inputs)
    if len(expected) == 1:
        columns = {next(iter(expected)): columns}
    same(as_arrays(columns, expected), "TF Serving REST columns")


def test_rest_b64_and_single_input_forms(server):
    assert rest_rows(server, "toy", TOY_X) == [[2.5], [1.0], [2.125]]
    status, body = call_json(server, "POST", "/v1/models/toy:predict", {"instances": [[4.0]]})
    assert (status, body) == (200, {"predictions": [[4.0]]})
    status, body = call_json(server, "POST", "/v1/models/toy:predict", {"inputs": [[0.0]]})
    assert (status, body) == (200, {"outputs": [[2.0]]})
    inputs = demo_inputs(2)
    import base64

    rows = [{"dense": inputs["dense"][i].tolist(), "sparse_ids": inputs["sparse_ids"][i].tolist(),
             "sparse_tokens": [{"b64": base64.b64encode(t).decode()} for t in inputs["sparse_tokens"][i]]}
            for i in range(2)]
    status, body = call_json(server, "POST", "/v1/models/demo:predict", {"instances": rows})
    assert status == 200 and len(body["predictions"]) == 2, body
    assert body["predictions"] == rest_rows(server, "demo", inputs)


# --- routing, readiness -------------------------------------------------------------------------

def test_two_models_routed_by_name_unknown_is_not_found(server, channel):
    assert ours_http(server, "toy", {"x": np.array([[2.0]], np.float32)})["y"].tolist() == [[3.0]]
    assert "probability" in ours_http(server, "demo", demo_inputs(1))
    for method, path, body in [
        ("POST", "/api/predict/nope", codec.encode_request(TOY_X)),
        ("GET", "/api/models/nope", None),
        ("POST", "/v1/models/nope:predict", b'{"instances": [[1.0]]}'),
        ("GET", "/v1/models/nope", None),
        ("GET", "/v1/models/nope/metadata", None),
        ("GET", "/v2/models/nope/ready", None),
    ]:
        status, _, data = call(server, method, path, body)
        assert status == 404 and "unknown model 'nope'" in json.loads(data)["error"], (path, data)
    err = grpc_error(ours_grpc, channel, "nope", TOY_X)
    assert err.code() == grpc.StatusCode.NOT_FOUND and "unknown model 'nope'" in err.details()
    err = grpc_error(tfs_grpc, channel, "nope", TOY_X)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    err = grpc_error(model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus,
                     get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "nope"}))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_model_with_missing_files_is_unready_while_others_serve(server, channel):
    status, body = call_json(server, "GET", "/readyz")
    assert status == 503 and body["models"] == {"toy": "ready", "demo": "ready", "broken": "failed"}
    assert "broken" in body["error"]
    assert call_json(server, "GET", "/v2/health/ready")[0] == 503
    assert call_json(server, "GET", "/healthz") == (200, {"live": True})
    assert call_json(server, "GET", "/v2/health/live")[0] == 200
    assert call_json(server, "GET", "/v2/models/toy/ready")[0] == 200
    status, body = call_json(server, "GET", "/v2/models/broken/ready")
    assert status == 503 and "saved_model.pb" in body["error"]
    status, body = call_json(server, "GET", "/v1/models/broken")
    (version,) = body["model_version_status"]
    assert status == 200 and version["state"] == "END" and "saved_model.pb" in version["status"]["error_message"]
    status, body = call_json(server, "POST", "/v1/models/broken:predict", {"instances": [[1.0]]})
    assert status == 503 and "no version ready" in body["error"]
    err = grpc_error(ours_grpc, channel, "broken", TOY_X)
    assert err.code() == grpc.StatusCode.UNAVAILABLE

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    expected = {"": not_serving, "toy": serving, "demo": serving, "broken": not_serving,
                "tensorflow.serving.PredictionService": serving}
    deadline = time.monotonic() + 5  # the health service follows the models within its poll interval
    while True:
        states = {s: health.Check(health_pb2.HealthCheckRequest(service=s), timeout=5).status for s in expected}
        if states == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert states == expected
    assert ours_http(server, "toy", TOY_X)["y"].shape == (3, 1)


# --- bad input ----------------------------------------------------------------------------------

GOOD_JSON = b'{"instances": [[1.0]]}'
BAD_HTTP = [
    ("POST", "/api/predict/toy", b"\x0a\xff\xff garbage", 400, "not a serialized"),
    ("POST", "/api/predict/toy", codec.encode_request({"x": np.array([[1.0]], np.float64)}), 400, "dtype"),
    ("POST", "/api/predict/toy", codec.encode_request({"z": np.array([[1.0]], np.float32)}), 400, "unknown input"),
    ("POST", "/v1/models/toy:predict", b"{not json", 400, "JSON Parse error"),
    ("POST", "/v1/models/toy:predict", b'{"instances": [["a"]]}', 400, "expects numbers"),
    # TF Serving's shape rule: the graph decides (the toy's elementwise graph takes [[1.0, 2.0]]);
    # what it cannot take is the engine's own 400
    ("POST", "/v1/models/demo:predict",
     b'{"instances": [{"dense": [0,0,0,0,0,0,0,0,0,0,0,0], "sparse_ids": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],'
     b' "sparse_tokens": ["a","a","a","a","a","a"]}]}', 400, "the model rejected the input"),
    ("POST", "/v1/models/toy:predict", b'{"instances": [[1], [1, 2]]}', 400, "ragged"),
    ("POST", "/v1/models/toy:predict", b'{"instances": [[1]], "inputs": [[1]]}', 400, "Not both"),
    ("POST", "/v1/models/toy:predict", b'{"signature_name": "other", "inputs": [[1]]}', 400,
     'Serving signature name: "other" not found in signature def'),
    ("POST", "/v1/models/toy/versions/99:predict", GOOD_JSON, 404, "Servable not found"),
    ("POST", "/v1/models/toy/labels/nope:predict", GOOD_JSON, 400, "Unrecognized servable version label"),
    ("POST", "/v1/models/toy/versions/x:predict", GOOD_JSON, 400, "Malformed request"),
    ("POST", "/v1/models/toy:regress", GOOD_JSON, 400, "key 'examples' is expected"),
    ("POST", "/v1/models/demo:predict",
     b'{"instances": [{"dense": [0,0,0,0,0,0,0,0,0,0,0,0,0], "sparse_ids": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],'
     b' "sparse_tokens": [{"b64": "***"},"a","a","a","a","a"]}]}', 400, "invalid base64"),
    ("GET", "/v1/models/toy/versions/99", None, 404, "Could not find version 99"),
    ("GET", "/v1/models/toy/versions/99/metadata", None, 404, "Servable not found"),
    ("GET", "/v1/models", None, 400, "Missing model name"),
    ("GET", "/v1/models/toy/bogus", None, 400, "Malformed request"),
    ("GET", "/nowhere", None, 404, "no such endpoint"),
    ("DELETE", "/api/predict/toy", None, 405, ""),
    ("PUT", "/admin/models/toy/pin", b'{"version": "x"}', 400, "version"),
]


@pytest.mark.parametrize("method, path, body, status, message", BAD_HTTP,
                         ids=[f"{m} {p} {i}" for i, (m, p, *_ ) in enumerate(BAD_HTTP)])
def test_bad_http_request_is_4xx_error_json(server, method, path, body, status, message):
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    got, _, data = call(server, method, path, body, headers=headers)
    doc = json.loads(data)
    assert got == status and set(doc) == {"error"} and message in doc["error"], (got, doc)
    assert ours_http(server, "toy", TOY_X)["y"].tolist() == [[2.5], [1.0], [2.125]]  # still serving


def test_bad_grpc_requests(server, channel):
    from processor.proto import predict_pb2, processor_service_pb2_grpc
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    ours = processor_service_pb2_grpc.ProcessorServiceStub(channel)
    err = grpc_error(ours.Predict, predict_pb2.PredictRequest())  # several models: name required
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "model-name" in err.details()
    raw = channel.unary_unary("/tensorflow.eas.ProcessorService/Predict")
    # an empty message is DeepRec's ping, as an empty HTTP body: the signature JSON (raw bytes)
    assert raw(b"", metadata=[("model-name", "toy")]) == call(server, "POST", "/api/predict/toy", b"")[2]
    missing = predict_pb2.PredictRequest(output_filter=["y"]).SerializeToString()
    err = grpc_error(raw, missing, metadata=[("model-name", "toy")])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "missing input" in err.details()
    err = grpc_error(raw, b"\x0a\xff\xff garbage", metadata=[("model-name", "toy")])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT

    err = grpc_error(tfs_grpc, channel, "toy", {"x": np.array([["a"]], dtype=object)})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "dtype" in err.details()
    from tensorflow_serving.apis import predict_pb2 as tfs_predict_pb2

    for dims in ((2**40, 2**40), (LIMIT, 1)):  # one value broadcast past max_request_bytes: refused, not built
        request = tfs_predict_pb2.PredictRequest(model_spec={"name": "toy"})
        request.inputs["x"].dtype = 1
        request.inputs["x"].float_val.append(1.0)
        for d in dims:
            request.inputs["x"].tensor_shape.dim.add(size=d)
        err = grpc_error(prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict, request)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_bytes" in err.details()
    err = grpc_error(tfs_grpc, channel, "toy", TOY_X, version=42)
    assert err.code() == grpc.StatusCode.NOT_FOUND and "Specific(toy, 42)" in err.details()
    err = grpc_error(tfs_grpc, channel, "toy", TOY_X, signature_name="other")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # TF Serving's code and words
    assert err.details().startswith('Serving signature key "other" not found.')
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    err = grpc_error(stub.GetModelMetadata, get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec={"name": "toy"}, metadata_field=["graph"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    from tensorflow_serving.apis import classification_pb2

    err = grpc_error(stub.Classify, classification_pb2.ClassificationRequest(model_spec={"name": "toy"}))
    assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    assert tfs_grpc(channel, "toy", TOY_X, version=1)[1]["y"].tolist() == [[2.5], [1.0], [2.125]]


def test_oversized_requests_refused_on_both_transports(server, channel):
    big = {"x": np.zeros((LIMIT // 4 + 1000, 1), np.float32)}
    body = codec.encode_request(big)
    assert len(body) > LIMIT
    status, _, data = call(server, "POST", "/api/predict/toy", body)
    assert status == 413 and "max_request_bytes" in json.loads(data)["error"]
    rows = json.dumps({"inputs": [[0.0]] * (LIMIT // 5)}).encode()
    status, _, data = call(server, "POST", "/v1/models/toy:predict", rows)
    assert status == 413 and "max_request_bytes" in json.loads(data)["error"]
    assert call(server, "POST", "/v1/models/toy:predict", GOOD_JSON)[0] == 200
    err = grpc_error(ours_grpc, channel, "toy", big)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    err = grpc_error(tfs_grpc, channel, "toy", big)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ours_grpc(channel, "toy", TOY_X)["y"].shape == (3, 1)


# --- status, metadata, info ---------------------------------------------------------------------

def test_tf_serving_status_and_metadata(server, channel, ctr_model_small):
    status, body = call_json(server, "GET", "/v1/models/toy")
    assert (status, body) == (200, {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})
    assert call_json(server, "GET", "/v1/models/toy/labels/stable")[0] == 200
    assert call_json(server, "GET", "/V1/MODELS/toy/versions/1")[0] == 200  # case-insensitive
    status, body = call_json(server, "GET", "/v1/models/demo/metadata")
    assert status == 200 and body["model_spec"] == {
        "name": "demo", "signature_name": "", "version": str(ctr_model_small.steps[-1])}
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert set(sig["inputs"]) == {"dense", "sparse_ids", "sparse_tokens"}
    assert sig["inputs"]["sparse_ids"]["dtype"] == "DT_INT64"
    assert sig["inputs"]["dense"]["tensor_shape"]["dim"][1]["size"] == "13"

    from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2,
                                         model_service_pb2_grpc, prediction_service_pb2_grpc)

    md = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(
        get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": "demo"},
                                                       metadata_field=["signature_def"]), timeout=10)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    md.metadata["signature_def"].Unpack(sig_map)
    assert md.model_spec.version.value == ctr_model_small.steps[-1]
    assert set(sig_map.signature_def["serving_default"].outputs) == {"probability", "logits"}
    st = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "toy"}), timeout=10)
    assert [(v.version, v.state) for v in st.model_version_status] == [(1, 30)]  # AVAILABLE


def test_model_info(server):
    status, body = call_json(server, "GET", "/api/models/demo")
    assert status == 200 and body["state"] == "ready"
    assert body["version"]["full_step"] == body["tf_serving_version"]
    assert {i["name"] for i in body["signature"]["inputs"]} == {"dense", "sparse_ids", "sparse_tokens"}
    assert body["config"]["session_num"] == 2 and body["inference_threads"] == 4
    status, _, data = call(server, "POST", "/api/predict/toy", b"")  # empty: the signature, as process()
    assert status == 200 and json.loads(data)["inputs"][0]["name"] == "x"
    status, body = call_json(server, "GET", "/api/models")
    assert {m["name"]: m["ready"] for m in body["models"]} == {"toy": True, "demo": True, "broken": False}


# --- operations ---------------------------------------------------------------------------------

def test_metrics_request_ids_openapi(server, channel):
    ours_http(server, "toy", TOY_X)
    status, headers, data = call(server, "POST", "/api/predict/toy", codec.encode_request(TOY_X),
                                 headers={"X-Request-ID": "req-abc-123"})
    assert status == 200 and headers["x-request-id"] == "req-abc-123"
    status, headers, _ = call(server, "GET", "/healthz")
    assert len(headers["x-request-id"]) == 16  # generated
    from processor.proto import predict_pb2, processor_service_pb2_grpc

    _, call_info = processor_service_pb2_grpc.ProcessorServiceStub(channel).Predict.with_call(
        predict_pb2.PredictRequest.FromString(codec.encode_request(TOY_X)),
        metadata=[("model-name", "toy"), ("x-request-id", "grpc-req-1")], timeout=10)
    assert ("x-request-id", "grpc-req-1") in tuple(call_info.trailing_metadata())

    for path in ("/metrics", "/monitoring/prometheus/metrics"):
        status, headers, data = call(server, "GET", path)
        text = data.decode()
        assert status == 200 and headers["content-type"].startswith("text/plain")
        assert 'sp_requests_total{api="predict",code="OK",model="toy",protocol="http",version="1"}' in text
        assert 'protocol="grpc"' in text and 'code="NOT_FOUND"' in text
        assert 'sp_request_latency_seconds_bucket{api="predict"' in text
        assert 'sp_model_ready{model="broken"} 0.0' in text and 'sp_model_ready{model="toy"} 1.0' in text
        assert 'sp_model_served_version{model="toy",version="1"} 1.0' in text
        assert 'sp_model_update_duration_seconds_count{kind="start",model="toy"} 1.0' in text
        assert 'sp_model_update_failures_total{kind="start",model="broken"} 1.0' in text
        assert "sp_model_full_loads_total" in text and "sp_feature_store_latency_seconds" in text

    status, body = call_json(server, "GET", "/openapi.json")
    assert status == 200
    paths = set(body["paths"])
    assert {"/api/predict/{model}", "/v1/models/{path}", "/healthz", "/readyz", "/metrics",
            "/admin/models/{model}/reload", "/admin/models/{model}/pin"} <= paths
    assert call(server, "GET", "/docs")[0] == 200


def test_admin_token_reload_pin_unpin_rollback(server, ctr_model_small):
    first, last = ctr_model_small.steps[0], ctr_model_small.steps[-1]
    status, body = call_json(server, "POST", "/admin/models/demo/reload")
    assert status == 401 and "token" in body["error"]
    status, body = call_json(server, "POST", "/admin/models/demo/reload", headers={"Authorization": "Bearer wrong"})
    assert status == 403
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    status, body = call_json(server, "POST", "/admin/models/demo/reload", headers=auth)
    assert status == 200 and body["version"]["full_step"] == last, body
    status, body = call_json(server, "POST", "/admin/models/nope/reload", headers=auth)
    assert status == 404
    status, body = call_json(server, "POST", "/admin/models/broken/reload", headers=auth)
    assert status == 503 and "saved_model.pb" in body["error"]  # still missing: the load fails

    status, body = call_json(server, "PUT", "/admin/models/demo/pin", {"version": first}, headers=auth)
    assert status == 200 and body["version"]["full_step"] == first and body["pinned"], body
    assert call_json(server, "GET", f"/v1/models/demo/versions/{first}")[0] == 200
    assert call_json(server, "POST", f"/v1/models/demo/versions/{last}:predict",
                     {"inputs": {k: jsonable(v) for k, v in demo_inputs(1).items()}})[0] == 404
    status, body = call_json(server, "PUT", "/admin/models/demo/pin", {"version": 123456}, headers=auth)
    assert status == 404, body
    status, body = call_json(server, "DELETE", "/admin/models/demo/pin", headers={"X-Admin-Token": ADMIN_TOKEN})
    assert status == 200 and body["version"]["full_step"] == last and not body["pinned"], body
    status, body = call_json(server, "POST", "/admin/models/demo/rollback", headers=auth)
    assert status == 200 and body["version"]["full_step"] == first, body
    status, body = call_json(server, "DELETE", "/admin/models/demo/pin", headers=auth)
    assert status == 200 and body["version"]["full_step"] == last
    assert call_json(server, "GET", "/v1/models/demo")[1]["model_version_status"][0]["version"] == str(last)
