"""KServe v2 binary requests answered from a prepared form (server/http/v2_prepared.py).

A real ServingApp (uvicorn + our protocol, in a thread) serves the DLRM-like ``.onnx`` model.
The second request of a plain binary form (the same JSON header) is answered from the form
kept after the first: byte for byte what the ordinary path answers to the same tensors, and
what ``process()`` computes. Forms that are not plain (an ``id``, JSON data or JSON outputs)
are never kept; a kept form's request whose binary part does not fit gets the ordinary path's
400; a deadline that passed is a 504 either way.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from processor import codec
from processor.deployment import DeploymentConfig

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
        "host": "127.0.0.1", "http_port": 0, "grpc_port": None, "access_log": False})
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
    """How each binary request was answered from now on: True from a prepared form."""
    from server.http.v2_prepared import PreparedInfers

    out: list[bool] = []
    real = PreparedInfers.answer

    def spied(self, *args, **kwargs):
        reply = real(self, *args, **kwargs)
        out.append(reply is not None)
        return reply
    monkeypatch.setattr(PreparedInfers, "answer", spied)
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
    assert answered == [False, True, True, False]
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
    status, _, out = post(server, body[:-8], n)  # the binary part is short
    assert status == 400 and "binary" in json.loads(out)["error"] and answered[-1] is False
    status, _, out = post(server, body, n, {"X-Request-Timeout-Ms": "0.001"})  # its deadline passes at once
    assert status == 504 and "deadline" in json.loads(out)["error"]
