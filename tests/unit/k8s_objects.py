"""The objects of deploy/kubernetes (loaded with PyYAML), shared by tests/unit/test_deploy_manifests.py
and tests/e2e/deploy/test_deploy_render.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"

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
