"""The Open Inference Protocol (KServe v2) against a real server, with tritonclient (HTTP and
gRPC) and KServe's plain v2 JSON: predictions equal process(), metadata matches the signature,
bad datatypes / shapes are 400 / INVALID_ARGUMENT, binary tensors round-trip."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import model_config
from sp_checks import FLOAT_ATOL, FLOAT_RTOL
from processor import codec

tritonclient = pytest.importorskip("tritonclient", reason="tritonclient is a dev dependency (scripts/setup.sh)")
import tritonclient.grpc as tgrpc  # noqa: E402
import tritonclient.http as thttp  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

TOY_X = np.array([[1.0], [2.0], [-3.5]], np.float32)


@pytest.fixture(scope="module")
def models(toy_model, ctr_model_small):
    return {
        "toy": model_config(toy_model),
        "demo": model_config(ctr_model_small, backend="onnxruntime", use_per_session_threads=True, session_num=2,
                             batching={"max_batch_size": 32, "batch_timeout_micros": 0}),
        "demo_tf": model_config(ctr_model_small, backend="tensorflow"),
    }


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    from tools.server_process import ServerProcess

    work = tmp_path_factory.mktemp("v2")
    deployment = {"models": [{"name": n, "model_config": c} for n, c in models.items()],
                  "drain_timeout_seconds": 10, "access_log": False}
    proc = ServerProcess(deployment, work).start(timeout=180)
    assert set(proc.wait_models(90).values()) == {"ready"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def reference(models):
    from processor.processor import Processor

    made = {n: Processor.create(n, json.dumps({k: v for k, v in c.items() if k != "batching"}))
            for n, c in models.items()}
    yield made
    for p in made.values():
        p.close()


@pytest.fixture(scope="module")
def http_client(server):
    client = thttp.InferenceServerClient(server.http.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server):
    client = tgrpc.InferenceServerClient(server.grpc_target)
    yield client
    client.close()


def feeds_of(model: str) -> dict[str, np.ndarray]:
    from demo.synthetic_data import synthetic_batch

    return {"x": TOY_X} if model == "toy" else synthetic_batch(5, 17)


def expected(reference, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    status, body = reference[model].process(codec.encode_request(feeds))
    assert status == 200, body
    return codec.decode_response(body)


DATATYPE = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.int64): "INT64",
            np.dtype(np.int32): "INT32", np.dtype(object): "BYTES"}


def infer_inputs(module, feeds: dict[str, np.ndarray], binary: bool) -> list:
    out = []
    for name, array in feeds.items():
        tensor = module.InferInput(name, list(array.shape), DATATYPE[array.dtype])
        if module is thttp:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def assert_outputs(result, want: dict[str, np.ndarray]) -> None:
    for name, array in want.items():
        got = result.as_numpy(name)
        assert got is not None, name
        assert got.shape == array.shape and got.dtype == array.dtype, (name, got.shape, got.dtype)
        # the server's process against this one's reference
        np.testing.assert_allclose(got, array, rtol=FLOAT_RTOL, atol=FLOAT_ATOL)


@pytest.mark.parametrize("model", ["toy", "demo", "demo_tf"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http_infer_equals_process(http_client, reference, model, binary):
    feeds = feeds_of(model)
    want = expected(reference, model, feeds)
    outputs = [thttp.InferRequestedOutput(name, binary_data=binary) for name in want]
    result = http_client.infer(model, infer_inputs(thttp, feeds, binary), outputs=outputs, request_id="r-1")
    assert_outputs(result, want)
    assert result.get_response()["id"] == "r-1" and result.get_response()["model_name"] == model


@pytest.mark.parametrize("model", ["toy", "demo", "demo_tf"])
def test_tritonclient_grpc_infer_equals_process(grpc_client, reference, model):
    feeds = feeds_of(model)
    want = expected(reference, model, feeds)
    result = grpc_client.infer(model, infer_inputs(tgrpc, feeds, True), request_id="r-2")
    assert_outputs(result, want)
    only = next(iter(want))  # one output asked for: one answered
    result = grpc_client.infer(model, infer_inputs(tgrpc, feeds, True), outputs=[tgrpc.InferRequestedOutput(only)])
    assert [o.name for o in result.get_response().outputs] == [only]


def test_health_and_metadata_match_the_signature(http_client, grpc_client, reference):
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    for client in (http_client, grpc_client):
        assert client.is_model_ready("toy") and client.is_model_ready("toy", "1")
        assert not client.is_model_ready("toy", "999")
    meta = http_client.get_server_metadata()
    assert meta["name"] == "serving-processor" and "binary_tensor_data" in meta["extensions"]
    for model, platform in (("toy", "tensorflow_savedmodel"), ("demo", "onnxruntime_onnx")):
        signature = reference[model].dataplane.served(model).signature
        meta = http_client.get_model_metadata(model)
        assert meta["platform"] == platform and len(meta["versions"]) == 1
        assert [t["name"] for t in meta["inputs"]] == list(signature.inputs)
        assert [t["name"] for t in meta["outputs"]] == list(signature.outputs)
        g = grpc_client.get_model_metadata(model)
        assert [(t.name, t.datatype, list(t.shape)) for t in g.inputs] == [
            (t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]]
    toy = http_client.get_model_metadata("toy")
    assert toy["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]


def post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(server.http + path, data=body, headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_plain_v2_json_as_kserve_sends_it(server, reference):
    body = json.dumps({"id": "k", "inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32",
                                              "data": TOY_X.ravel().tolist()}]}).encode()
    status, _, raw = post(server, "/v2/models/toy/infer", body)
    assert status == 200, raw
    doc = json.loads(raw)
    assert doc["model_name"] == "toy" and doc["id"] == "k"
    (out,) = doc["outputs"]
    want = expected(reference, "toy", {"x": TOY_X})["y"]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [3, 1]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(3, 1), want, rtol=FLOAT_RTOL, atol=FLOAT_ATOL)
    # nested data and a version in the path
    body = json.dumps({"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": TOY_X.tolist()}]}).encode()
    assert post(server, "/v2/models/toy/versions/1/infer", body)[0] == 200


@pytest.mark.parametrize("tensor, status, words", [
    ({"name": "x", "shape": [3, 1], "datatype": "FP64", "data": [1, 2, 3]}, 400, "dtype"),
    ({"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [1, 2]}, 400, "elements"),
    ({"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}, 400, "shape"),
    ({"name": "x", "shape": [1, 1], "datatype": "COMPLEX", "data": [1]}, 400, "unknown datatype"),
    ({"name": "x", "shape": [1, 1], "datatype": "FP32", "data": ["a"]}, 400, "numbers"),
    ({"name": "nope", "shape": [1, 1], "datatype": "FP32", "data": [1]}, 400, "nope"),
])
def test_bad_tensors_are_400_naming_the_problem(server, tensor, status, words):
    code, _, raw = post(server, "/v2/models/toy/infer", json.dumps({"inputs": [tensor]}).encode())
    assert code == status, raw
    assert words in json.loads(raw)["error"]


def test_unknown_model_or_version_is_404_and_grpc_errors_map(server, http_client, grpc_client):
    assert post(server, "/v2/models/nope/infer", b'{"inputs": []}')[0] == 404
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}).encode()
    assert post(server, "/v2/models/toy/versions/7/infer", body)[0] == 404
    assert post(server, "/v2/models/toy/infer", b"{not json")[0] == 400
    bad = tgrpc.InferInput("x", [3, 1], "FP64")
    bad.set_data_from_numpy(TOY_X.astype(np.float64))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("toy", [bad])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "dtype" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_model_metadata("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    bad_http = thttp.InferInput("x", [3, 1], "FP64")
    bad_http.set_data_from_numpy(TOY_X.astype(np.float64))
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("toy", [bad_http])
    assert info.value.status() == "400" and "dtype" in info.value.message()


def test_binary_tensors_round_trip_bytes_and_fp32(server, reference):
    """The binary extension by hand: BYTES (length-prefixed) and FP32 inputs, binary outputs."""
    import struct

    feeds = feeds_of("demo")
    want = expected(reference, "demo", feeds)
    header_inputs, blobs = [], []
    for name, array in feeds.items():
        if array.dtype == object:
            raw = b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
        else:
            raw = np.ascontiguousarray(array).tobytes()
        header_inputs.append({"name": name, "shape": list(array.shape), "datatype": DATATYPE[array.dtype],
                              "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    header = json.dumps({"inputs": header_inputs, "parameters": {"binary_data_output": True}}).encode()
    status, headers, raw = post(server, "/v2/models/demo/infer", header + b"".join(blobs),
                                {"Content-Type": "application/octet-stream",
                                 "Inference-Header-Content-Length": str(len(header))})
    assert status == 200, raw
    n = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    doc, at = json.loads(raw[:n]), n
    for out in doc["outputs"]:
        size = out["parameters"]["binary_data_size"]
        array = np.frombuffer(raw[at:at + size], np.float32).reshape(out["shape"])
        at += size
        np.testing.assert_allclose(array, want[out["name"]], rtol=FLOAT_RTOL, atol=FLOAT_ATOL)
    assert at == len(raw) and {o["name"] for o in doc["outputs"]} == set(want)
