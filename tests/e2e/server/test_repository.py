"""Load and unload on request against a real server (server/repository.py): KServe v2's repository
extension with tritonclient (HTTP and gRPC) and TF Serving's HandleReloadConfigRequest with the
official stub. Index, unload (then 404 / NOT_FOUND), load by name, load with a config override,
a bad config (400 / INVALID_ARGUMENT naming the key, nothing changed), no or a wrong admin token
(401 / 403, UNAUTHENTICATED / PERMISSION_DENIED); a TF Serving config of two models serves both,
then one of them the other 404s. The DLRM-like ``.onnx`` model (small) and the TF Serving toy.
One server for the module: the tests run in order, each from the state the one before left.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from models.dlrm_models import FEEDS, build_models, predict

tritonclient = pytest.importorskip("tritonclient", reason="tritonclient is a dev dependency (scripts/setup.sh)")
import tritonclient.grpc as tgrpc  # noqa: E402
import tritonclient.http as thttp  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "repository-admin-token"
BEARER = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("repository"))


def config(directory: Path, **more) -> dict:
    return {"savedmodel_dir": str(directory), "backend": "onnxruntime", "session_num": 1,
            "file_system_poll_wait_seconds": 0, **more}


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    from tools.server_process import ServerProcess

    deployment = {"models": [{"name": "a", "model_config": config(models["a"])}], "admin_token": TOKEN,
                  "access_log": False, "drain_timeout_seconds": 5}
    with ServerProcess(deployment, tmp_path_factory.mktemp("server")) as proc:
        yield proc


def rows(index: list[dict], name: str) -> list[tuple[str, str]]:
    """(state, reason) of each row of model ``name``."""
    return [(r["state"], r.get("reason", "")) for r in index if r["name"] == name]


def refused(fn, status: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        fn()
    assert info.value.status() == status, (info.value.status(), info.value.message())
    return info.value.message()


def test_http_index_unload_load(server, models):
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    assert rows(client.get_model_repository_index(headers=BEARER), "a") == [("READY", "")]
    status, want_a = predict(server, "a")
    assert status == 200

    client.unload_model("a", headers=BEARER)
    assert rows(client.get_model_repository_index(headers=BEARER), "a") == [("UNAVAILABLE", "unloaded")]
    assert predict(server, "a")[0] == 404
    assert not client.is_model_ready("a")

    client.load_model("a", headers=BEARER)  # by name: the entry remembered
    assert rows(client.get_model_repository_index(headers=BEARER), "a") == [("READY", "")]
    np.testing.assert_allclose(predict(server, "a")[1], want_a, rtol=1e-5, atol=1e-6)

    client.load_model("c", headers=BEARER, config=json.dumps(config(models["b"])))  # a new name, overridden
    status, got_c = predict(server, "c")
    assert status == 200 and not np.allclose(got_c, want_a)
    assert [r["name"] for r in client.get_model_repository_index(headers=BEARER)] == ["a", "c"]


def test_http_bad_config_and_admin_gate(server, models):
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    before = client.get_model_repository_index(headers=BEARER)
    message = refused(lambda: client.load_model("a", headers=BEARER, config=json.dumps(
        config(models["b"], session_num="two"))), "400")
    assert "model_config.session_num" in message
    assert "parameters.config: not valid JSON" in refused(
        lambda: client.load_model("a", headers=BEARER, config="{"), "400")
    assert "unknown model_config key" in refused(lambda: client.load_model("a", headers=BEARER, config=json.dumps(
        {**config(models["b"]), "sesion_num": 1})), "400")
    assert client.get_model_repository_index(headers=BEARER) == before  # nothing changed

    missing = models["a"].parent / "missing"  # valid, and it does not load: the served one serves on
    message = refused(lambda: client.load_model("a", headers=BEARER, config=json.dumps(config(missing))), "400")
    assert "model 'a' did not load" in message and "missing" in message
    assert predict(server, "a")[0] == 200
    refused(lambda: client.load_model("e", headers=BEARER, config=json.dumps(config(missing))), "400")
    assert rows(client.get_model_repository_index(headers=BEARER), "e") == [("UNAVAILABLE", message.split(": ", 1)[1])]
    assert "'nope'" in refused(lambda: client.load_model("nope", headers=BEARER), "404")
    refused(lambda: client.unload_model("nope", headers=BEARER), "404")

    refused(lambda: client.get_model_repository_index(), "401")
    refused(lambda: client.unload_model("a"), "401")
    refused(lambda: client.load_model("a", headers={"x-admin-token": "wrong"}), "403")
    assert predict(server, "a")[0] == 200


def test_grpc_repository(server, models):
    client = tgrpc.InferenceServerClient(server.grpc_target)
    index = client.get_model_repository_index(headers=BEARER, as_json=True)["models"]
    assert rows(index, "a") == [("READY", "")] and rows(index, "c") == [("READY", "")]

    client.unload_model("c", headers=BEARER)
    index = client.get_model_repository_index(headers=BEARER, as_json=True)["models"]
    assert rows(index, "c") == [("UNAVAILABLE", "unloaded")]
    inputs = []
    for name, array in FEEDS.items():
        tensor = tgrpc.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    refused(lambda: client.infer("c", inputs), "StatusCode.NOT_FOUND")
    assert [r["name"] for r in _ready(server)] == ["a"]

    client.load_model("c", headers=BEARER)
    assert client.infer("c", inputs).as_numpy("prob").shape == (2, 1)
    client.load_model("d", headers=BEARER, config=json.dumps(config(models["a"])))
    np.testing.assert_allclose(client.infer("d", inputs).as_numpy("prob"), predict(server, "a")[1], rtol=1e-5)

    message = refused(lambda: client.load_model("d", headers=BEARER, config=json.dumps(
        config(models["a"], session_num=-1))), "StatusCode.INVALID_ARGUMENT")
    assert "model_config.session_num" in message
    assert predict(server, "d")[0] == 200
    refused(lambda: client.load_model("nope", headers=BEARER), "StatusCode.NOT_FOUND")
    refused(lambda: client.unload_model("d"), "StatusCode.UNAUTHENTICATED")
    refused(lambda: client.unload_model("d", headers={"authorization": "Bearer wrong"}),
            "StatusCode.PERMISSION_DENIED")
    assert predict(server, "d")[0] == 200


def _ready(server) -> list[dict]:
    """The HTTP index of the ready models (``{"ready": true}``)."""
    request = urllib.request.Request(server.http + "/v2/repository/index", data=b'{"ready": true}',
                                     headers={"X-Admin-Token": TOKEN})
    with urllib.request.urlopen(request, timeout=30) as resp:
        rows_ = json.loads(resp.read())
    assert all(r["state"] == "READY" for r in rows_)
    return rows_


def test_tfserving_reload_config(server, tmp_path):
    pytest.importorskip("tensorflow", reason="TensorFlow builds the TF Serving toy and is not installed")
    from models.toy_versions import export_version
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    bases = {}
    for name, a in (("x", 2.0), ("y", 3.0)):
        export_version(tmp_path / name, 1, a, 1.0)
        bases[name] = tmp_path / name

    def request(*names: str, platform: str = "tensorflow"):
        req = model_management_pb2.ReloadConfigRequest()
        for name in names:
            model = req.config.model_config_list.config.add(name=name, base_path=str(bases[name]),
                                                            model_platform=platform)
            model.model_version_policy.latest.num_versions = 1
        return req

    def tfs_predict(name: str) -> tuple[int, list | None]:
        body = json.dumps({"instances": [[1.0]]}).encode()
        req = urllib.request.Request(server.http + f"/v1/models/{name}:predict", data=body)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())["predictions"]
        except urllib.error.HTTPError as err:
            return err.code, None

    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.HandleReloadConfigRequest(request("x"), timeout=60)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            stub.HandleReloadConfigRequest(request("x", "y", platform="onnx"), timeout=60, metadata=metadata)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "model_platform" in info.value.details()

        response = stub.HandleReloadConfigRequest(request("x", "y"), timeout=120, metadata=metadata)
        assert response.status.error_code == 0
        assert tfs_predict("x") == (200, [[3.0]]) and tfs_predict("y") == (200, [[4.0]])
        assert predict(server, "a")[0] == 404  # the whole list replaced

        response = stub.HandleReloadConfigRequest(request("x"), timeout=120, metadata=metadata)
        assert response.status.error_code == 0
        assert tfs_predict("x") == (200, [[3.0]]) and tfs_predict("y")[0] == 404
    log = server.log()
    assert "repository config reload of x, y requested by" in log and "refused (401)" in log, log[-3000:]
