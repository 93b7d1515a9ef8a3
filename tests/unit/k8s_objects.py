"""The objects of deploy/kubernetes (loaded with PyYAML), shared by tests/unit/test_deploy_manifests.py,
tests/unit/test_deploy_kserve.py and tests/e2e/deploy/test_deploy_render.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
KSERVE = K8S / "kserve"

# files of deploy/kubernetes that are not Kubernetes objects
NOT_OBJECTS = {"kustomization.yaml", "prometheus-adapter-values.yaml"}


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name not in NOT_OBJECTS:
            out += [(path.name, d) for d in load(path)]
    return out


def one(kind: str, name: str | None = None) -> dict:
    found = [d for _, d in objects() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def deployment() -> dict:
    return one("Deployment", "serving-processor")


def container(pod_spec: dict, name: str, init: bool = False) -> dict:
    for c in pod_spec["initContainers" if init else "containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def pod() -> dict:
    return deployment()["spec"]["template"]["spec"]


def template_json() -> dict:
    return json.loads(one("ConfigMap", "serving-processor-config")["data"]["deployment.json"])


def kserve(kind: str) -> dict:
    """The one object of ``kind`` in deploy/kubernetes/kserve (ServingRuntime, InferenceService)."""
    docs = [d for p in sorted(KSERVE.glob("*.yaml")) for d in load(p) if d["kind"] == kind]
    assert len(docs) == 1
    return docs[0]


def server_routes() -> set[str]:
    """Every path the HTTP server routes (decorators of the HTTP transport's shared routes,
    server/http/*.py, and of each protocol's, server/<protocol>/*.py)."""
    out: set[str] = set()
    for path in (ROOT / "server").glob("*/*.py"):
        out |= set(re.findall(r'@\w+\.(?:get|post|put|delete|api_route)\(\s*"([^"]+)"', path.read_text()))
    return out
