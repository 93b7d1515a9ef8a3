"""The HTTP app's OpenAPI document (``/openapi.json``) over a fake model: KServe v2's metadata,
health and readiness routes are in it with their own paths, parameters and response
descriptions, whether the route is answered by FastAPI or before it (the inference fast path);
and the app is composed of the protocols handed to it (server/protocols.py)."""

from __future__ import annotations

import pytest

from fakes import FakeManager, fake_models
from server.settings import DeploymentConfig

DEFAULT = "Successful Response"  # FastAPI's description of a 200 nobody described


@pytest.fixture(scope="module")
def runtime():
    from server.runtime import ServingRuntime

    deployment = DeploymentConfig.from_dict({
        "models": [{"name": "m", "model_config": {"savedmodel_dir": "/nonexistent"}}], "access_log": False})
    rt = ServingRuntime(deployment, fake_models(deployment, {"m": FakeManager("m")}))
    yield rt
    rt.close()


def openapi(rt, protocols=None) -> dict:
    from server.app import PROTOCOLS
    from server.http.app import create_http_app

    return create_http_app(rt, PROTOCOLS if protocols is None else protocols).app.openapi()


KSERVE_GETS = {  # path -> the statuses its answers are documented with
    "/v2": {"200"},
    "/v2/health/live": {"200"},
    "/v2/health/ready": {"200", "503"},
    "/v2/models/{model}": {"200", "400", "404", "503"},
    "/v2/models/{model}/versions/{version}": {"200", "400", "404", "503"},
    "/v2/models/{model}/ready": {"200", "404", "503"},
    "/v2/models/{model}/versions/{version}/ready": {"200", "400", "404", "503"},
}


def test_kserve_v2_metadata_health_and_ready_routes_are_documented(runtime):
    paths = openapi(runtime)["paths"]
    for path, statuses in KSERVE_GETS.items():
        operation = paths[path]["get"]
        responses = operation["responses"]
        assert statuses <= set(responses), (path, sorted(responses))
        for status in statuses:
            assert responses[status]["description"] not in ("", DEFAULT), (path, status)
        assert "kserve-v2" in operation["tags"], path
        params = {p["name"]: p["in"] for p in operation.get("parameters", [])}
        # each path's own parameters: no version where the path names none
        assert params == {name: "path" for name in ("model", "version") if "{" + name + "}" in path}, (path, params)
    # readiness: 503 is "not ready", described as such on every readiness path
    for path in ("/v2/health/ready", "/v2/models/{model}/ready", "/v2/models/{model}/versions/{version}/ready"):
        assert "not ready" in paths[path]["get"]["responses"]["503"]["description"], path
    # a metadata GET takes no body: the body limits' statuses are not its own
    assert not {"408", "413", "431"} & set(paths["/v2/models/{model}"]["get"]["responses"])


def test_kserve_v2_infer_is_documented_though_the_fast_path_answers_it(runtime):
    paths = openapi(runtime)["paths"]
    for path in ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"):
        operation = paths[path]["post"]
        ok = operation["responses"]["200"]
        assert ok["description"] != DEFAULT and "X-Model-Version" in ok["headers"], path
        assert {"application/json", "application/octet-stream"} <= set(ok["content"]), path
        assert {"400", "404", "413", "503"} <= set(operation["responses"]), path
        assert {"application/json", "application/octet-stream"} <= set(operation["requestBody"]["content"])
        params = {p["name"] for p in operation.get("parameters", [])}
        assert params == ({"model", "version"} if "{version}" in path else {"model"}), (path, params)


def test_the_app_serves_the_protocols_it_is_given(runtime):
    from server import eas, kserve, tfserving

    def has(doc: dict, prefix: str) -> bool:
        return any(path.startswith(prefix) for path in doc["paths"])

    only_kserve = openapi(runtime, (kserve.PROTOCOL,))
    assert has(only_kserve, "/v2/models/{model}/infer") and has(only_kserve, "/v2/repository")
    assert not has(only_kserve, "/api/predict") and not has(only_kserve, "/v1/models")
    assert has(only_kserve, "/healthz") and has(only_kserve, "/admin/")  # shared by every protocol
    every = openapi(runtime)
    assert all(has(every, p) for p in ("/api/predict/{model}", "/v1/models/{path}", "/v2/models/{model}/infer"))
    assert [p.name for p in (eas.PROTOCOL, tfserving.PROTOCOL, kserve.PROTOCOL)] == ["eas", "tfserving", "kserve"]


def test_the_fast_path_matches_the_registered_inference_urls_in_order(runtime):
    from server.app import PROTOCOLS
    from server.http.app import create_http_app

    predict = create_http_app(runtime, PROTOCOLS).predict
    for path in ("/api/predict/m", "/api/predict/m/versions/2", "/api/predict/m/labels/stable",
                 "/v1/models/m:predict", "/V1/MODELS/m/versions/3:Classify", "/v2/models/m/infer",
                 "/v2/models/m/versions/1/infer"):
        assert predict.route(path) is not None, path
    for path in ("/api/predict/", "/api/predict/m/x/1", "/api/predict/m/versions/", "/v1/models/m",
                 "/v1/models/m:explain", "/v2/models/m", "/healthz"):
        assert predict.route(path) is None, path
