"""Several versions over gRPC, against a real server and the official clients: TF Serving's
``PredictionService`` / ``ModelService`` (``tensorflow_serving.apis`` stubs), KServe v2
(``tritonclient.grpc``) and our ``tensorflow.eas.ProcessorService`` (request metadata).

One ``python -m server`` on loopback ports; the TF1 toy exported as versions 1 and 2 of a TF
Serving base directory (version n answers y = n*x + 1), both served (``latest``, 2), labelled
``stable`` (1) and ``canary`` (2). Each version and each label gets its own version's answer,
and the answer names it; a version not served is NOT_FOUND; status and metadata list both; the
``x-routing-key`` metadata picks the arm of a traffic split. Raw-tensor requests go twice, so
the second one runs from its kept form (``server/infer_forms.py``), which must keep to its
version, also after a label moves.
"""

from __future__ import annotations

import http.client
import json

import grpc
import numpy as np
import pytest

from models.toy_versions import answer_of, export_versions
from processor import codec
from processor.routing import key_point
from sp_checks import wait_for

tgrpc = pytest.importorskip("tritonclient.grpc", reason="tritonclient is a dev dependency (scripts/setup.sh)")
from tritonclient.utils import InferenceServerException  # noqa: E402

ADMIN_TOKEN = "grpc-versions-admin-token"
RPC_TIMEOUT = 20.0
X = 2.0
EAS_PREDICT = "/tensorflow.eas.ProcessorService/Predict"
LABELS = {"stable": 1, "canary": 2}
# (what the request names, the version that must answer): by number, by label, neither (the default)
NAMED = [({"version": 1}, 1), ({"version": 2}, 2), ({"label": "stable"}, 1), ({"label": "canary"}, 2), ({}, 2)]


def y_of(number: int) -> float:
    """What version ``number`` answers at ``X``."""
    return answer_of(number, X)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tools.server_process import ServerProcess

    work = tmp_path_factory.mktemp("grpc-versions")
    base = work / "toy"
    export_versions(base)
    config = {"savedmodel_dir": str(base), "signature_name": "serving_default",
              "model_version_policy": {"latest": {"num_versions": 2}}}
    dep = {"models": [{"name": "m", "model_config": config, "version_labels": LABELS}],
           "admin_token": ADMIN_TOKEN, "access_log": False, "drain_timeout_seconds": 10}
    proc = ServerProcess(dep, work / "server").start(timeout=120)
    assert proc.wait_models(60) == {"m": "ready"}, proc.log()
    assert wait_for(lambda: sorted(v["version"] for v in proc.get_json("/api/models/m").get("versions") or ())
                    == [1, 2], 60), proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_target) as ch:
        yield ch


@pytest.fixture(scope="module")
def triton(server):
    client = tgrpc.InferenceServerClient(server.grpc_target)
    yield client
    client.close()


@pytest.fixture
def routing_reset(server):
    """Whatever a test changes, the next one starts with the module's labels and no split."""
    yield
    status, body = admin(server, {"traffic": None, "version_labels": LABELS})
    assert status == 200, body


def admin(server, body: dict) -> tuple[int, dict]:
    """``PUT /admin/models/m/routing``."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("PUT", "/admin/models/m/routing", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


# --- one request per protocol: (version that answered, y) -----------------------------------------

def tfs_predict(channel, named: dict, raw: bool = True, key: str | None = None) -> tuple[int, float]:
    """TF Serving's Predict; ``raw``: the input in ``tensor_content`` (kept forms), else ``float_val``."""
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    if "version" in named:
        request.model_spec.version.value = named["version"]
    if "label" in named:
        request.model_spec.version_label = named["label"]
    x = request.inputs["x"]
    x.dtype = 1  # DT_FLOAT
    x.tensor_shape.dim.add(size=1)
    x.tensor_shape.dim.add(size=1)
    if raw:
        x.tensor_content = np.array([X], "<f4").tobytes()
    else:
        x.float_val.append(X)
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        request, RPC_TIMEOUT, metadata=[("x-routing-key", key)] if key else None)
    return response.model_spec.version.value, float(np.ravel(_floats(response.outputs["y"]))[0])


def _floats(proto) -> np.ndarray:
    return np.frombuffer(proto.tensor_content, "<f4") if proto.tensor_content else np.array(proto.float_val)


def v2_infer(triton, version: str = "", key: str | None = None) -> tuple[int, float]:
    """KServe v2 ModelInfer (raw_input_contents, as tritonclient sends them)."""
    x = tgrpc.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[X]], np.float32))
    result = triton.infer("m", [x], model_version=version, headers={"x-routing-key": key} if key else None)
    return int(result.get_response().model_version), float(result.as_numpy("y").ravel()[0])


def eas_predict(channel, metadata: dict[str, str]) -> tuple[int, float]:
    """Our ProcessorService/Predict; the version from the answer's initial metadata."""
    call = channel.unary_unary(EAS_PREDICT)
    body, rpc = call.with_call(codec.encode_request({"x": np.array([[X]], np.float32)}), timeout=RPC_TIMEOUT,
                               metadata=[("model-name", "m"), *metadata.items()])
    version = dict(rpc.initial_metadata())["x-model-version"]
    return int(version), float(codec.decode_response(body)["y"].ravel()[0])


def _eas_metadata(named: dict) -> dict[str, str]:
    if "version" in named:
        return {"x-model-version": str(named["version"])}
    return {"x-model-label": named["label"]} if "label" in named else {}


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


# --- the tests ------------------------------------------------------------------------------------

def test_get_model_status_lists_every_served_version_newest_first(channel):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    stub = model_service_pb2_grpc.ModelServiceStub(channel)

    def status(**spec):
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "m"
        if "version" in spec:
            request.model_spec.version.value = spec["version"]
        if "label" in spec:
            request.model_spec.version_label = spec["label"]
        response = stub.GetModelStatus(request, RPC_TIMEOUT)
        return [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state), s.status.error_code)
                for s in response.model_version_status]

    assert status() == [(2, "AVAILABLE", 0), (1, "AVAILABLE", 0)]
    assert status(version=1) == [(1, "AVAILABLE", 0)]
    assert status(label="canary") == [(2, "AVAILABLE", 0)]
    assert _code(lambda: status(version=3)) == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("named, number", NAMED)
def test_tf_serving_predict_runs_on_the_named_version(channel, named, number):
    for raw in (True, True, False):  # the second raw one from its kept form
        assert tfs_predict(channel, named, raw) == (number, y_of(number)), (named, raw)


def test_tf_serving_metadata_names_the_version(channel):
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    for named, number in NAMED:
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = "m"
        if "version" in named:
            request.model_spec.version.value = named["version"]
        if "label" in named:
            request.model_spec.version_label = named["label"]
        assert stub.GetModelMetadata(request, RPC_TIMEOUT).model_spec.version.value == number, named


def test_a_version_not_served_is_not_found_everywhere(channel, triton):
    assert _code(lambda: tfs_predict(channel, {"version": 3})) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: eas_predict(channel, {"x-model-version": "3"})) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: eas_predict(channel, {"x-model-version": "v1"})) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: eas_predict(channel, {"x-model-label": "nope"})) == grpc.StatusCode.INVALID_ARGUMENT
    for call in (lambda: v2_infer(triton, "3"), lambda: triton.get_model_metadata("m", "3")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.NOT_FOUND", info.value
    assert not triton.is_model_ready("m", "3")


def test_v2_lists_both_versions_and_runs_on_the_named_one(triton):
    assert list(triton.get_model_metadata("m").versions) == ["1", "2"]
    assert list(triton.get_model_metadata("m", "1").versions) == ["1", "2"]
    assert triton.is_model_ready("m", "1") and triton.is_model_ready("m", "2")
    for version, number in (("1", 1), ("2", 2), ("", 2)):
        for _ in range(2):  # the second from its kept form
            assert v2_infer(triton, version) == (number, y_of(number)), version


@pytest.mark.parametrize("named, number", NAMED)
def test_eas_predict_runs_on_the_version_its_metadata_names(channel, named, number):
    assert eas_predict(channel, _eas_metadata(named)) == (number, y_of(number))


def test_a_kept_form_follows_its_label_when_it_moves(server, channel, routing_reset):
    for _ in range(2):
        assert tfs_predict(channel, {"label": "stable"}) == (1, y_of(1))
    status, body = admin(server, {"version_labels": {"stable": 2, "canary": 1}})
    assert status == 200, body
    for _ in range(2):
        assert tfs_predict(channel, {"label": "stable"}) == (2, y_of(2))
        assert eas_predict(channel, {"x-model-label": "stable"}) == (2, y_of(2))


def test_the_routing_key_picks_the_arm_of_a_split(server, channel, triton, routing_reset):
    status, body = admin(server, {"traffic": {"stable": 50, "canary": 50}})
    assert status == 200, body
    keys = {}  # a key of each arm: stable below 0.5, canary above
    for i in range(100):
        keys.setdefault(1 if key_point(f"user-{i}") < 0.5 else 2, f"user-{i}")
    for number, key in sorted(keys.items()):
        for _ in range(3):
            assert tfs_predict(channel, {}, key=key) == (number, y_of(number)), key
            assert v2_infer(triton, key=key) == (number, y_of(number)), key
            assert eas_predict(channel, {"x-routing-key": key}) == (number, y_of(number)), key
        # a call naming its version never meets the split
        assert tfs_predict(channel, {"version": 3 - number}, key=key) == (3 - number, y_of(3 - number))
        assert eas_predict(channel, {"x-routing-key": key, "x-model-version": str(3 - number)})[0] == 3 - number
