"""deploy/kubernetes-tfserving (issue 48): the TF Serving variant of the manifests validates offline
and agrees with the image variant (docker/Dockerfile.tfserving, docker/tfserving-entrypoint.sh):
gRPC on 8500 and REST on 8501, the model named by MODEL_NAME under /models, the entry point's own
command line, the probes and Prometheus on paths the server routes."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) not installed")

from unit.k8s_objects import ROOT, container, load, objects, server_routes  # noqa: E402
from unit.test_deploy_manifests import OLDEST_K8S, _apply_json6902, _versions  # noqa: E402

VARIANT = ROOT / "deploy" / "kubernetes-tfserving"


def _variant_objects() -> dict[str, dict]:
    """The overlay's objects: the base's, patched as its kustomization says, plus its own."""
    kust = yaml.safe_load((VARIANT / "kustomization.yaml").read_text())
    assert kust["resources"][0] == "../kubernetes"
    out = {f"{d['kind']}/{d['metadata']['name']}": d for _, d in objects()}
    for patch in kust["patches"]:
        target = patch["target"]
        key = f"{target['kind']}/{target['name']}"
        out[key] = _apply_json6902(out[key], yaml.safe_load((VARIANT / patch["path"]).read_text()))
    for name in kust["resources"][1:]:
        for doc in load(VARIANT / name):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_the_overlay_holds_what_the_tests_know():
    assert {p.name for p in VARIANT.iterdir()} == {"kustomization.yaml", "deployment-patch.yaml",
                                                   "service-patch.yaml", "models-pvc.yaml"}


@pytest.mark.parametrize("version", [OLDEST_K8S, _versions()[-1]])
def test_the_overlay_validates_strictly(version):
    objects_ = _variant_objects()
    for key in ("Deployment/serving-processor", "Service/serving-processor",
                "PersistentVolumeClaim/serving-processor-models"):
        try:
            kubernetes_validate.validate(objects_[key], version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"TF Serving overlay {key} on Kubernetes {version}: {'.'.join(map(str, exc.path))}: "
                        f"{exc.message}")


def test_the_overlay_agrees_with_the_image_variant():
    objects_ = _variant_objects()
    kust = yaml.safe_load((VARIANT / "kustomization.yaml").read_text())
    assert kust["images"][0]["newTag"] == "tfserving"
    pod = objects_["Deployment/serving-processor"]["spec"]["template"]
    spec = pod["spec"]
    server = container(spec, "server")
    dockerfile = (ROOT / "docker" / "Dockerfile.tfserving").read_text()
    entry = (ROOT / "docker" / "tfserving-entrypoint.sh").read_text()
    # the entry point's own command line: no serving-processor arguments, no deployment.json to render
    assert server["args"] == [] and spec["initContainers"] == []
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"grpc": 8500, "http": 8501}
    assert re.search(r"^EXPOSE 8500 8501$", dockerfile, re.M) and "--port=8500 --rest_api_port=8501" in entry
    env = {e["name"]: e for e in server["env"]}
    assert env["MODEL_NAME"]["value"]
    # the models' volume where the image looks: ${MODEL_BASE_PATH} (/models)
    base_path = re.search(r"^ENV MODEL_BASE_PATH=(\S+)", dockerfile, re.M).group(1)
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    assert mounts["models"]["mountPath"] == base_path and mounts["models"]["readOnly"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    assert f"PersistentVolumeClaim/{claim}" in objects_
    # probes and Prometheus: paths the server routes, on its REST port
    routes = server_routes() | {"/monitoring/prometheus/metrics"}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert server[probe]["httpGet"]["port"] == "http" and server[probe]["httpGet"]["path"] in routes
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8501" and annotations["prometheus.io/path"] in routes
    service = objects_["Service/serving-processor"]["spec"]["ports"]
    assert {(p["name"], p["port"], p["targetPort"]) for p in service} == {("http", 8501, "http"),
                                                                          ("grpc", 8500, "grpc")}


def test_the_overlay_builds_with_kustomize():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize builds the overlay offline)")
    out = subprocess.run([kubectl, "kustomize", str(VARIANT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(out.stdout) if d}
    ours = _variant_objects()
    for key in ("Deployment/serving-processor", "Service/serving-processor",
                "PersistentVolumeClaim/serving-processor-models"):
        if key == "Deployment/serving-processor":  # kustomize also sets the image tag
            for c in built[key]["spec"]["template"]["spec"]["containers"]:
                c["image"] = "serving-processor:cpu"
        assert built[key] == ours[key], key
