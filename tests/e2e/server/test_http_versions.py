"""Several versions over HTTP, against a real server: versions and labels in the URL of every
inference route (our wire format, TF Serving REST, KServe v2 REST), ``X-Model-Version`` on
every answer, ``X-Routing-Key`` picking a traffic arm, and the routing admin routes.

One ``python -m server`` on loopback ports; the TF1 toy exported as versions 1 and 2 of a TF
Serving base directory (version n answers y = n*x + 1), both served (``latest``, 2), labelled
``stable`` (1) and ``canary`` (2), as two models: ``m`` on TensorFlow and ``o`` on ONNX Runtime
(whose small requests the connection answers in place). Each request goes both ways in: with a
``Content-Length`` (the connection's lean path) and chunked (the ASGI route).
"""

from __future__ import annotations

import http.client
import json
import urllib.request

import numpy as np
import pytest

from models.toy_versions import answer_of, export_versions
from processor import codec
from sp_checks import wait_for

ADMIN_TOKEN = "http-versions-admin-token"
X = 2.0
PATHS = ("lean", "asgi")
MODELS = ("m", "o")  # TensorFlow, ONNX Runtime


def y_of(number: int) -> float:
    """What version ``number`` answers at ``X``."""
    return answer_of(number, X)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tools.server_process import ServerProcess

    work = tmp_path_factory.mktemp("http-versions")
    base = work / "toy"
    export_versions(base)
    config = {"savedmodel_dir": str(base), "signature_name": "serving_default",
              "model_version_policy": {"latest": {"num_versions": 2}}}
    labels = {"stable": 1, "canary": 2}
    dep = {"models": [{"name": "m", "model_config": config, "version_labels": labels},
                      {"name": "o", "model_config": {**config, "backend": "onnxruntime"}, "version_labels": labels}],
           "admin_token": ADMIN_TOKEN, "access_log": False, "drain_timeout_seconds": 10}
    proc = ServerProcess(dep, work / "server").start(timeout=120)
    assert proc.wait_models(60) == {"m": "ready", "o": "ready"}, proc.log()
    assert wait_for(lambda: all(served(proc, name) == [1, 2] for name in MODELS), 60), proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


def served(server, model: str) -> list[int]:
    """The versions ``model`` serves (model info)."""
    with urllib.request.urlopen(f"{server.http}/api/models/{model}", timeout=10) as resp:
        return sorted(v["version"] for v in json.loads(resp.read()).get("versions") or ())


@pytest.fixture
def routing_reset(server):
    """Whatever a test changes, the next one starts without a traffic split."""
    yield
    status, body = admin(server, "PUT", {"traffic": None, "version_labels": {"stable": 1, "canary": 2}})
    assert status == 200, body


def post(server, path: str, body: bytes, headers: dict[str, str] | None = None,
         way: str = "lean") -> tuple[int, http.client.HTTPMessage, bytes]:
    """POST ``body`` on a fresh connection: with a Content-Length (``lean``) or chunked
    (``asgi``: the connection's lean path takes only a known length)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        if way == "lean":
            conn.request("POST", path, body=body, headers=headers or {})
        else:
            conn.request("POST", path, body=iter([body]), headers=headers or {}, encode_chunked=True)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def admin(server, method: str, body: dict | None = None, token: str | None = ADMIN_TOKEN) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, "/admin/models/m/routing", body=None if body is None else json.dumps(body),
                     headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


# --- one request per protocol: (status, X-Model-Version, y or the error) ------------------------

def _headers(content_type: str, key: str | None) -> dict[str, str]:
    return {"Content-Type": content_type, **({"X-Routing-Key": key} if key else {})}


def wire(server, suffix: str = "", key: str | None = None, way: str = "lean", model: str = "m"):
    """Our wire format: ``POST /api/predict/{model}{suffix}``."""
    status, head, body = post(server, f"/api/predict/{model}{suffix}",
                              codec.encode_request({"x": np.array([[X]], np.float32)}),
                              _headers("application/x-protobuf", key), way)
    if status != 200:
        return status, head["X-Model-Version"], json.loads(body)["error"]
    return status, head["X-Model-Version"], float(codec.decode_response(body)["y"].ravel()[0])


def tfs(server, spec: str = "", key: str | None = None, way: str = "lean", model: str = "m"):
    """TF Serving REST: ``POST /v1/models/{model}{spec}:predict``."""
    status, head, body = post(server, f"/v1/models/{model}{spec}:predict", b'{"instances": [[%r]]}' % X,
                              _headers("application/json", key), way)
    doc = json.loads(body)
    return status, head["X-Model-Version"], doc["predictions"][0][0] if status == 200 else doc["error"]


def v2(server, version: str | None = None, key: str | None = None, way: str = "lean", model: str = "m",
       binary: bool = False):
    """KServe v2 REST infer, JSON or (``binary``) binary tensors in and out."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    headers = _headers("application/json", key)
    if binary:
        raw = np.array([[X]], np.float32).tobytes()
        doc = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1],
                                      "parameters": {"binary_data_size": len(raw)}}],
                          "parameters": {"binary_data_output": True}}).encode()
        headers["Inference-Header-Content-Length"] = str(len(doc))
        body = doc + raw
    else:
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [X]}]}).encode()
    status, head, answer = post(server, path, body, headers, way)
    if status != 200:
        return status, head["X-Model-Version"], json.loads(answer)["error"]
    if binary:
        n = int(head["Inference-Header-Content-Length"])
        doc, y = json.loads(answer[:n]), float(np.frombuffer(answer[n:], np.float32)[0])
    else:
        doc = json.loads(answer)
        y = doc["outputs"][0]["data"][0]
    assert doc["model_version"] == head["X-Model-Version"], doc
    return status, head["X-Model-Version"], y


def answered(number: int) -> tuple[int, str, float]:
    return 200, str(number), y_of(number)


# --- tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("way", PATHS)
def test_each_version_and_label_answers_on_every_protocol(server, way, model):
    for _ in range(2):  # the second time: our wire format's in-place hint and v2's prepared forms are warm
        for number, label in ((1, "stable"), (2, "canary")):
            assert wire(server, f"/versions/{number}", way=way, model=model) == answered(number)
            assert wire(server, f"/labels/{label}", way=way, model=model) == answered(number)
            assert tfs(server, f"/versions/{number}", way=way, model=model) == answered(number)
            assert tfs(server, f"/labels/{label}", way=way, model=model) == answered(number)
            assert v2(server, str(number), way=way, model=model) == answered(number)
            assert v2(server, str(number), way=way, model=model, binary=True) == answered(number)
        for call in (wire, tfs, v2):  # naming none: the newest, the default
            assert call(server, way=way, model=model) == answered(2)
        assert v2(server, way=way, model=model, binary=True) == answered(2)


@pytest.mark.parametrize("way", PATHS)
def test_a_version_not_served_is_404_and_a_bad_one_400(server, way):
    for status, version, error in (wire(server, "/versions/3", way=way), tfs(server, "/versions/3", way=way),
                                   v2(server, "3", way=way)):
        assert (status, version) == (404, None) and "3" in error, error
    status, version, error = wire(server, "/versions/x1", way=way)
    assert (status, version) == (400, None) and "x1" in error, error
    status, _, error = wire(server, "/versions/" + "9" * 20, way=way)
    assert status == 400, error
    status, _, error = wire(server, "/labels/nope", way=way)
    assert status == 400 and "nope" in error, error
    status, _, _ = post(server, "/api/predict/m/branches/1", b"", way=way)
    assert status == 404


def test_routing_admin_splits_the_traffic(server, routing_reset):
    status, body = admin(server, "GET")
    assert status == 200 and body["routing"]["version_labels"] == {"stable": 1, "canary": 2}, body
    assert admin(server, "PUT", {"traffic": {"stable": 100}}, token=None)[0] == 401
    status, body = admin(server, "PUT", {"traffic": {"stable": 100}, "weights": {}})
    assert status == 400 and "weights" in body["error"], body

    status, body = admin(server, "PUT", {"traffic": {"stable": 0, "canary": 100}})
    assert status == 200 and body["routing"]["traffic"] == {"stable": 0, "canary": 100}, body
    for way in PATHS:
        for call in (wire, tfs, v2):
            assert call(server, way=way) == answered(2)

    status, body = admin(server, "PUT", {"traffic": {"stable": 100, "canary": 0}})
    assert status == 200, body
    for way in PATHS:
        for call in (wire, tfs, v2):
            assert call(server, key="someone", way=way) == answered(1)
        assert v2(server, way=way, binary=True) == answered(1)  # a prepared form meets the split too
    # a failed request's access-log line (always written) names the version and the arm
    assert post(server, "/api/predict/m", b"\xff not a request", _headers("application/x-protobuf", None))[0] == 400
    assert wait_for(lambda: '"version": "1/stable"' in server.log(), 10), server.log()[-1500:]

    status, body = admin(server, "PUT", {"version_labels": {"stable": 1, "canary": 7}})
    assert status == 400 and "version 7" in body["error"], body
    assert admin(server, "GET")[1]["routing"]["version_labels"] == {"stable": 1, "canary": 2}  # unchanged
    assert wire(server, "/labels/canary") == answered(2)
    assert wire(server) == answered(1)


def test_one_routing_key_meets_one_version(server, routing_reset):
    status, body = admin(server, "PUT", {"traffic": {"stable": 50, "canary": 50}})
    assert status == 200, body
    for key in ("user-1", "user-2", "user-3"):
        met = {wire(server, key=key)}
        for i in range(20):
            met.add((wire, tfs, v2)[i % 3](server, key=key, way=PATHS[i % 2]))
        assert len(met) == 1, (key, met)  # every protocol, both paths: one version
    arms = {wire(server, key=f"user-{i}")[1] for i in range(40)}
    assert arms == {"1", "2"}, arms  # the keys do spread over both arms


def test_classify_and_regress_pass_the_routing_key_on():
    """TF Serving REST ``:classify`` / ``:regress`` (the toy has no such signature: in process,
    the DataPlane's call looked at) carry ``X-Routing-Key`` as the call's routing key."""
    from types import SimpleNamespace

    from server.tfserving.rest_predict import tfs_reply

    calls = []

    class Seen(Exception):
        pass

    def predict(call):
        calls.append(call)
        raise Seen

    rt = SimpleNamespace(dataplane=SimpleNamespace(predict=predict))
    for method in ("classify", "regress"):
        for key in ("user-1", None):
            with pytest.raises(Seen):
                tfs_reply(rt, "m", None, "canary", method, b'{"examples": [{"x": 1.0}]}', key=key)
    assert [(c.routing_key, c.label) for c in calls] == [("user-1", "canary"), (None, "canary")] * 2


def test_metrics_show_every_version_and_count_requests_by_the_version_that_answered(server):
    model = MODELS[0]
    for _ in range(3):
        assert wire(server, "/versions/1", model=model) == answered(1)
    with urllib.request.urlopen(server.http + "/metrics", timeout=10) as resp:
        text = resp.read().decode()

    def samples(name: str) -> dict[str, float]:
        prefix = name + "{"
        return {line.split("{", 1)[1].rsplit("}", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith(prefix) and f'model="{model}"' in line}

    assert samples("sp_model_versions_served") == {f'model="{model}"': 2.0}
    with urllib.request.urlopen(server.http + "/readyz", timeout=10) as resp:
        assert json.loads(resp.read())["versions"] == {"m": [1, 2], "o": [1, 2]}
    assert {k for k in samples("sp_model_served_version")} == {f'model="{model}",version="1"',
                                                                f'model="{model}",version="2"'}
    weights = {k: v for k, v in samples("sp_model_memory_bytes").items() if 'part="weights"' in k}
    assert len(weights) == 2 and all(v > 0 for v in weights.values()), weights
    by_version = {k: v for k, v in samples("sp_requests_total").items() if 'code="OK"' in k and 'api="predict"' in k}
    assert any('version="1"' in k and v >= 3 for k, v in by_version.items()), by_version
