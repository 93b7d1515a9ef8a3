"""deploy/kubernetes/kserve: KServe's ServingRuntime and InferenceService (and the TLS variant)
validate against the openAPIV3Schema of KServe's own CRDs, vendored unmodified in
tests/data/kserve (source and checksums in its README.md), made strict as the API server's strict
field validation makes them; they agree with the server; the runtime's launcher script is run
(in this process) on each model layout it accepts.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

from processor.config import ModelConfig  # noqa: E402
from server.settings import DeploymentConfig  # noqa: E402

from unit.k8s_objects import KSERVE, ROOT  # noqa: E402
from unit.k8s_objects import kserve as _kserve  # noqa: E402
from unit.k8s_objects import load as _load  # noqa: E402
from unit.k8s_objects import server_routes as _server_routes  # noqa: E402

CRDS = ROOT / "tests" / "data" / "kserve"


@functools.lru_cache(maxsize=None)
def _crd_schema(filename: str, api_version: str, kind: str) -> dict:
    path = CRDS / filename
    data = gzip.decompress(path.read_bytes())
    readme = (CRDS / "README.md").read_text()
    digest = hashlib.sha256(data).hexdigest()
    assert digest in readme, f"{filename}: sha256 {digest} is not the one tests/data/kserve/README.md records"
    crd = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 2 MB: libyaml when there
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            assert v["served"], f"{api_version} {kind} is not served by this CRD"
            return _strict(v["schema"]["openAPIV3Schema"])
    raise AssertionError(f"the CRD has no version {version}")


def _strict(schema: Any) -> Any:
    """Unknown fields become errors, as the API server's strict field validation makes them
    (structural schemas prune them otherwise): every object schema that lists properties and
    neither allows other keys nor preserves unknown fields gets additionalProperties: false."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_strict(v) if k != "properties" else {p: _strict(s) for p, s in v.items()})
           for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _crd_validator(doc: dict) -> jsonschema.protocols.Validator:
    files = {"ServingRuntime": "serving.kserve.io_servingruntimes.yaml.gz",
             "InferenceService": "serving.kserve.io_inferenceservices.yaml.gz"}
    schema = _crd_schema(files[doc["kind"]], doc["apiVersion"], doc["kind"])
    # OpenAPI 3.0 schema objects: JSON Schema draft 4 semantics (exclusiveMinimum is a boolean)
    return jsonschema.Draft4Validator(schema)


@pytest.mark.parametrize("kind", ["ServingRuntime", "InferenceService"])
def test_kserve_objects_validate_against_kserves_crds(kind):
    doc = _kserve(kind)
    errors = sorted(_crd_validator(doc).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_kserve_validation_can_fail():
    runtime = _kserve("ServingRuntime")
    validator = _crd_validator(runtime)
    typo = copy.deepcopy(runtime)
    typo["spec"]["supportedModelFormat"] = typo["spec"].pop("supportedModelFormats")
    wrong_type = copy.deepcopy(runtime)
    wrong_type["spec"]["supportedModelFormats"][0]["autoSelect"] = "false"
    no_containers = copy.deepcopy(runtime)
    del no_containers["spec"]["containers"]
    nested_typo = copy.deepcopy(runtime)
    nested_typo["spec"]["containers"][0]["readinesProbe"] = nested_typo["spec"]["containers"][0].pop("readinessProbe")
    for bad in (typo, wrong_type, no_containers, nested_typo):
        assert list(validator.iter_errors(bad)), bad
    isvc = _kserve("InferenceService")
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["scaleMetric"] = "in-flight"  # not one of KServe's enum values
    assert list(_crd_validator(isvc).iter_errors(bad))


def test_kserve_runtime_declares_our_formats_and_protocols():
    runtime = _kserve("ServingRuntime")
    spec = runtime["spec"]
    formats = {(f["name"], f.get("version")) for f in spec["supportedModelFormats"]}
    assert formats == {("tensorflow", "1"), ("tensorflow", "2"), ("onnx", "1")}
    # KServe's protocol names (pkg/constants: v1, v2, grpc-v1, grpc-v2): v1 / grpc-v1 are TF
    # Serving's REST and gRPC APIs, v2 / grpc-v2 the Open Inference Protocol
    assert spec["protocolVersions"] == ["v1", "grpc-v1", "v2", "grpc-v2"]
    container = spec["containers"][0]
    assert container["name"] == "kserve-container" and "{{.Name}}" in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] in _server_routes()
    assert container["livenessProbe"]["httpGet"]["path"] in _server_routes()
    isvc = _kserve("InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["protocolVersion"] in spec["protocolVersions"]
    ModelConfig.from_dict({"savedmodel_dir": "/mnt/models/savedmodel",
                           **json.loads(next(e["value"] for e in model["env"] if e["name"] == "SP_MODEL_CONFIG"))})


class _Exec(Exception):
    pass


def _run_launcher(tmp_path: Path, monkeypatch) -> dict:
    """Run the ServingRuntime's launcher script here (its exec stopped); the deployment it wrote."""
    container = _kserve("ServingRuntime")["spec"]["containers"][0]
    assert container["command"] == ["python", "-c"]
    script, name_arg = container["args"]
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["-c", name_arg.replace("{{.Name}}", "demo")])

    def fake_exec(file, args):
        raise _Exec(file, args)

    monkeypatch.setattr(os, "execvp", fake_exec)
    with pytest.raises(_Exec) as info:
        exec(compile(script, "servingruntime.yaml", "exec"), {"__name__": "__main__"})
    file, args = info.value.args
    assert file == "serving-processor" and args[:2] == ["serving-processor", "--config"]
    return json.loads(Path(args[2]).read_text())


@pytest.mark.parametrize("layout", ["processor", "onnx", "savedmodel", "store"])
def test_kserve_launcher_writes_a_valid_deployment(layout, tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    extra: dict[str, Any] = {"session_num": 2}
    if layout == "processor":
        (models / "savedmodel").mkdir()
        (models / "checkpoints").mkdir()
        want = {"savedmodel_dir": f"{models}/savedmodel", "checkpoint_dir": f"{models}/checkpoints"}
    elif layout == "onnx":
        (models / "model.onnx").write_bytes(b"")
        want = {"savedmodel_dir": f"{models}/model.onnx"}
    elif layout == "savedmodel":
        (models / "saved_model.pb").write_bytes(b"")
        want = {"savedmodel_dir": str(models)}
    else:
        extra.update(model_store_type="s3", savedmodel_dir="s3://b/demo/savedmodel",
                     checkpoint_dir="s3://b/demo/checkpoints")
        want = {"savedmodel_dir": "s3://b/demo/savedmodel", "checkpoint_dir": "s3://b/demo/checkpoints"}
    monkeypatch.setenv("SP_MODEL_DIR", str(models))
    monkeypatch.setenv("SP_MODEL_CONFIG", json.dumps(extra))
    written = _run_launcher(tmp_path, monkeypatch)
    dep = DeploymentConfig.from_dict(written)
    assert dep.host == "0.0.0.0" and (dep.http_port, dep.grpc_port) == (8080, 8500)
    (entry,) = dep.models
    assert entry.name == "demo" and entry.config.session_num == 2
    assert {k: v for k, v in written["models"][0]["model_config"].items() if k in want} == want


KSERVE_TLS = KSERVE / "tls" / "inferenceservice.yaml"


def test_kserve_tls_variant_validates_and_agrees(tmp_path, monkeypatch):
    (isvc,) = _load(KSERVE_TLS)
    errors = sorted(_crd_validator(isvc).iter_errors(isvc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    runtime = _kserve("ServingRuntime")
    assert model["runtime"] == runtime["metadata"]["name"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    env = {e["name"]: e["value"] for e in model["env"]}
    (tmp_path / "models" / "savedmodel").mkdir(parents=True)
    monkeypatch.setenv("SP_MODEL_DIR", str(tmp_path / "models"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    dep = DeploymentConfig.from_dict(_run_launcher(tmp_path, monkeypatch))
    assert dep.http_tls_on and dep.grpc_tls_on and dep.host == "0.0.0.0"
    volumes = {v["name"]: v for v in predictor["volumes"]}
    mount = {m["name"]: m for m in model["volumeMounts"]}["tls"]
    assert mount["readOnly"] and volumes["tls"]["secret"]["defaultMode"] == 0o440
    assert predictor["securityContext"]["fsGroup"] == runtime["spec"]["containers"][0]["securityContext"]["runAsUser"]
    for path, key in ((dep.tls_cert_file, "tls.crt"), (dep.tls_key_file, "tls.key"), (dep.tls_client_ca_file, "ca.crt")):
        assert path == f"{mount['mountPath']}/{key}"
    from server.http.health_port import PATHS

    for probe in ("readinessProbe", "livenessProbe"):
        assert model[probe]["httpGet"]["port"] == dep.health_port and model[probe]["httpGet"]["path"] in PATHS
    assert int(isvc["metadata"]["annotations"]["prometheus.kserve.io/port"]) == dep.health_port
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/path"] in PATHS
