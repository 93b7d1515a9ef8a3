"""Requests of raw tensors run from a form seen before (server/infer_forms.py): KServe v2 over
HTTP (server/kserve/rest_prepared.py) and gRPC (ModelInfer's raw contents), TF Serving gRPC's
``tensor_content``.

A real ServingApp (uvicorn + our protocol and grpc, in a thread) serves the DLRM-like ``.onnx``
model. The second request of a plain binary form (over HTTP the same JSON header) is answered
from the form kept after the first: byte for byte what the ordinary path answers to the same
tensors, and what ``process()`` computes. Forms that are not plain (an ``id`` over HTTP, JSON
data or JSON outputs, parameters, typed contents) are never kept; a kept form's request whose
raw bytes do not fit gets the ordinary path's 400 / INVALID_ARGUMENT; a deadline that passed
is a 504 either way.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from processor import codec
from server.settings import DeploymentConfig

MODEL = "dlrm"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from demo import dlrm_onnx

    directory = tmp_path_factory.mktemp("v2prep") / "dlrm"
    dlrm_onnx.build(directory / "model.onnx", rows=500, dim=8)
    return directory


def model_config(model_dir) -> dict:
    return {"savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1}


@pytest.fixture(scope="module")
def server(model_dir):
    from server.app import ServingApp

    deployment = DeploymentConfig.from_dict({
        "models": [{"name": MODEL, "model_config": model_config(model_dir)}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False})
    app = ServingApp(deployment, announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(60), "server did not start"
    app.runtime.wait_models(120)
    yield app
    app.request_stop()
    thread.join(30)


@pytest.fixture
def answered(monkeypatch):
    """How each request of a kept form was answered from now on: True from the form."""
    from server.infer_forms import InferForms

    out: list[bool] = []
    real = InferForms.run

    def spied(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        out.append(result is not None)
        return result
    monkeypatch.setattr(InferForms, "run", spied)
    return out


def binary_body(feeds: dict[str, np.ndarray], extra_input_params: dict | None = None, **top) -> tuple[bytes, int]:
    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    doc = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatypes[v.dtype],
                       "parameters": {"binary_data_size": v.nbytes, **(extra_input_params or {})}}
                      for k, v in feeds.items()],
           "parameters": {"binary_data_output": True}, **top}
    header = json.dumps(doc).encode()
    return header + b"".join(np.ascontiguousarray(v).tobytes() for v in feeds.values()), len(header)


def post(app, body: bytes, header_length: int | None, extra: dict | None = None) -> tuple[int, dict, bytes]:
    headers = {"Content-Type": "application/octet-stream" if header_length is not None else "application/json",
               **(extra or {})}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    req = urllib.request.Request(f"http://127.0.0.1:{app.http_port}/v2/models/{MODEL}/infer", data=body,
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def split(headers: dict, body: bytes) -> tuple[dict, bytes]:
    n = int(headers["inference-header-content-length"])
    return json.loads(body[:n]), body[n:]


def reference(model_dir, feeds) -> np.ndarray:
    from processor.processor import Processor

    proc = Processor.create("ref", json.dumps(model_config(model_dir)))
    try:
        return codec.decode_response(proc.process(codec.encode_request(feeds))[1])["prob"]
    finally:
        proc.close()


def test_a_repeated_plain_form_is_answered_from_it_as_the_ordinary_path_answers(server, model_dir, answered):
    from demo import dlrm_onnx

    first, second = dlrm_onnx.inputs(3, seed=21), dlrm_onnx.inputs(3, seed=22)
    body1, n = binary_body(first)
    body2, n2 = binary_body(second)
    assert n2 == n and body1[:n] == body2[:n]  # one form, other tensors
    status1, headers1, out1 = post(server, body1, n)  # the ordinary path; the form is kept
    status2, headers2, out2 = post(server, body2, n)  # from the form
    status3, headers3, out3 = post(server, body1, n)  # from the form: the first request's answer again
    # the same tensors in a form that is not plain (an unknown input parameter): the ordinary path
    other, m = binary_body(second, {"note": 1})
    status4, headers4, out4 = post(server, other, m)
    assert (status1, status2, status3, status4) == (200, 200, 200, 200)
    assert answered == [True, True]  # the first and the last have no kept form
    assert out3 == out1 and headers3["inference-header-content-length"] == headers1["inference-header-content-length"]
    assert out2 == out4 and headers2["inference-header-content-length"] == headers4["inference-header-content-length"]
    assert headers2["content-type"] == "application/octet-stream"
    doc, raw = split(headers2, out2)
    assert doc["model_name"] == MODEL and doc["outputs"][0]["shape"] == [3, 1]
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == len(raw) == 12
    np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(3, 1), reference(model_dir, second),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["id", "json outputs", "json inputs"])
def test_forms_that_are_not_plain_are_never_kept(server, model_dir, answered, form):
    from demo import dlrm_onnx

    feeds = dlrm_onnx.inputs(2, seed=5)
    if form == "json inputs":
        doc = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32" if v.dtype == np.float32 else "INT64",
                           "data": v.ravel().tolist()} for k, v in feeds.items()]}
        body, n = json.dumps(doc).encode(), None
    else:
        body, n = binary_body(feeds, **({"id": "req-7"} if form == "id" else {}))
        if form == "json outputs":
            head = json.loads(body[:n])
            head["parameters"] = {"binary_data_output": False}
            header = json.dumps(head).encode()
            body, n = header + body[n:], len(header)
    answers = [post(server, body, n) for _ in range(3)]
    assert [a[0] for a in answers] == [200] * 3
    assert not any(answered)
    for status, headers, out in answers:
        doc, raw = split(headers, out) if "inference-header-content-length" in headers else (json.loads(out), b"")
        got = np.frombuffer(raw, "<f4") if raw else np.asarray(doc["outputs"][0]["data"], np.float32)
        np.testing.assert_allclose(got.reshape(2, 1), reference(model_dir, feeds), rtol=1e-5, atol=1e-6)
        if form == "id":
            assert doc["id"] == "req-7"


def test_a_kept_forms_request_that_does_not_fit_gets_the_ordinary_answer(server, answered):
    from demo import dlrm_onnx

    body, n = binary_body(dlrm_onnx.inputs(1, seed=3))
    assert post(server, body, n)[0] == 200
    assert post(server, body, n)[0] == 200 and answered[-1]
    status, _, out = post(server, body[:-8], n)  # the binary part is short: no form fits it
    assert status == 400 and "binary" in json.loads(out)["error"] and len(answered) == 1
    status, _, out = post(server, body, n, {"X-Request-Timeout-Ms": "0.001"})  # its deadline passes at once
    assert status == 504 and "deadline" in json.loads(out)["error"]


def through_a_form(server, method: str, request_type, response_type, make) -> tuple:
    """Over gRPC ``method``, ``make(feeds, kind)`` requests: one of a form (the ordinary path;
    the form is kept), another of that form (from the form), the same tensors in a form that
    is not kept (``"other"``: the ordinary path), and one of the form whose raw bytes are short
    (``"short"``). (the second request's feeds, its answer, the ordinary answer, the short one's
    status code)."""
    import grpc

    from demo import dlrm_onnx

    first, second = dlrm_onnx.inputs(2, seed=31), dlrm_onnx.inputs(2, seed=32)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    call = channel.unary_unary(method, request_serializer=request_type.SerializeToString,
                               response_deserializer=response_type.FromString)
    try:
        call(make(first, "form"), timeout=30)
        from_form = call(make(second, "form"), timeout=30)
        ordinary = call(make(second, "other"), timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            call(make(second, "short"), timeout=30)
    finally:
        channel.close()
    return second, from_form, ordinary, refused.value.code()


def test_grpc_model_infer_of_a_kept_form_answers_as_the_ordinary_path(server, model_dir, answered):
    import grpc

    from processor.proto import grpc_predict_v2_pb2 as pb

    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}

    def make(feeds, kind: str):
        # a parameter makes the form not plain: the ordinary path, the same answer
        extra = {"parameters": {"note": pb.InferParameter(int64_param=1)}} if kind == "other" else {}
        request = pb.ModelInferRequest(model_name=MODEL, id="grpc-1", **extra)
        for name, value in feeds.items():
            request.inputs.add(name=name, datatype=datatypes[value.dtype], shape=value.shape)
            request.raw_input_contents.append(np.ascontiguousarray(value).tobytes())
        if kind == "short":
            request.raw_input_contents[1] = request.raw_input_contents[1][:-8]
        return request

    feeds, from_form, ordinary, refused = through_a_form(
        server, "/inference.GRPCInferenceService/ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse, make)
    assert answered == [True, False]  # the second from the form; the short one: no form fits it
    assert from_form.SerializeToString() == ordinary.SerializeToString()
    assert from_form.id == "grpc-1" and list(from_form.outputs[0].shape) == [2, 1]
    np.testing.assert_allclose(np.frombuffer(from_form.raw_output_contents[0], "<f4").reshape(2, 1),
                               reference(model_dir, feeds), rtol=1e-5, atol=1e-6)
    assert refused == grpc.StatusCode.INVALID_ARGUMENT


def test_tf_serving_predict_of_a_kept_form_answers_as_the_ordinary_path(server, model_dir, answered):
    import grpc

    from server.tfserving.tensor_proto import from_numpy, to_numpy
    from server.tfserving.messages import messages

    types = messages()

    def make(feeds, kind: str):
        request = types.PredictRequest()
        request.model_spec.name = MODEL
        for name, value in feeds.items():  # "other": typed values, not tensor_content: no form
            from_numpy(value, request.inputs[name], tensor_content=not (kind == "other" and name == "sparse"))
        if kind == "short":
            request.inputs["dense"].tensor_content = request.inputs["dense"].tensor_content[:-4]
        return request

    feeds, from_form, ordinary, refused = through_a_form(
        server, "/tensorflow.serving.PredictionService/Predict", types.PredictRequest, types.PredictResponse, make)
    assert answered == [True, False]
    assert from_form.SerializeToString() == ordinary.SerializeToString()
    np.testing.assert_allclose(to_numpy("prob", from_form.outputs["prob"]), reference(model_dir, feeds),
                               rtol=1e-5, atol=1e-6)
    assert refused == grpc.StatusCode.INVALID_ARGUMENT
