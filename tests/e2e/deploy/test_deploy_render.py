"""The deployment JSON inside deploy/kubernetes' ConfigMap, rendered by the render-config init
container's own script (taken from deployment.yaml) run as a process, and validated with
server.settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from server.settings import DeploymentConfig  # noqa: E402
from unit.k8s_objects import ROOT  # noqa: E402
from unit.k8s_objects import container as _container  # noqa: E402
from unit.k8s_objects import one as _one  # noqa: E402
from unit.k8s_objects import pod as _pod  # noqa: E402
from unit.k8s_objects import template_json as _template_json  # noqa: E402


def _render(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    init = _container(_pod(), "render-config", init=True)
    assert init["command"] == ["python", "-c"]
    script, src, dst = init["args"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert src == f"{mounts['config-template']}/deployment.json"
    assert dst == f"{mounts['config']}/deployment.json"
    (tmp_path / "deployment.json").write_text(_one("ConfigMap", "serving-processor-config")["data"]["deployment.json"])
    run_env = {k: v for k, v in os.environ.items() if k != "REDIS_PASSWORD"}
    run_env.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", script, str(tmp_path / "deployment.json"), str(tmp_path / "out.json")],
                          env=run_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_the_configmaps_deployment_renders_and_validates(tmp_path):
    password = 'p"a\\ss ${x} $HOME word'  # JSON-hostile characters and a literal ${...} survive
    done = _render(tmp_path, {"REDIS_PASSWORD": password})
    assert done.returncode == 0, done.stderr
    rendered = json.loads((tmp_path / "out.json").read_text())
    assert oct((tmp_path / "out.json").stat().st_mode & 0o777) == "0o600"
    dep = DeploymentConfig.from_dict(rendered)
    (model,) = dep.models
    cfg = model.config
    assert cfg.redis_password == password
    assert cfg.feature_store_type == "cluster_redis" and cfg.model_store_type == "s3"
    assert cfg.savedmodel_dir.startswith("s3://") and cfg.checkpoint_dir.startswith("s3://")
    assert dep.host == "0.0.0.0" and dep.admin_token_env
    # nothing secret is in the ConfigMap itself
    template = _template_json()
    assert template["models"][0]["model_config"]["redis_password"] == "${REDIS_PASSWORD}"
    assert "admin_token" not in template
    assert not {"oss_access_id", "oss_access_key"} & set(template["models"][0]["model_config"])


def test_render_fails_clearly(tmp_path):
    done = _render(tmp_path, {})
    assert done.returncode == 1 and "REDIS_PASSWORD is not set" in done.stderr
    assert not (tmp_path / "out.json").exists()
    # a bad key stops the pod naming the key
    cm = _template_json()
    cm["models"][0]["model_config"]["session_num"] = "2"
    init = _container(_pod(), "render-config", init=True)
    (tmp_path / "bad.json").write_text(json.dumps(cm))
    done = subprocess.run([sys.executable, "-c", init["args"][0], str(tmp_path / "bad.json"), str(tmp_path / "o.json")],
                          env={**os.environ, "REDIS_PASSWORD": "x", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "session_num" in done.stderr, done.stderr


def test_the_tls_overlay_fragment_is_merged(tmp_path):
    """deploy/kubernetes-tls passes tls.json after the two paths: its keys join the deployment."""
    fragment = yaml.safe_load((ROOT / "deploy" / "kubernetes-tls" / "configmap-patch.yaml").read_text())[0]
    assert fragment["path"] == "/data/tls.json"
    (tmp_path / "tls.json").write_text(fragment["value"])
    (tmp_path / "deployment.json").write_text(_one("ConfigMap", "serving-processor-config")["data"]["deployment.json"])
    script = _container(_pod(), "render-config", init=True)["args"][0]
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "deployment.json"), str(tmp_path / "out.json"),
                           str(tmp_path / "tls.json")],
                          env={**os.environ, "REDIS_PASSWORD": "x", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    dep = DeploymentConfig.from_dict(json.loads((tmp_path / "out.json").read_text()))
    assert dep.tls_cert_file == "/etc/serving-processor/tls/tls.crt" and dep.health_port == 8081
    assert dep.models[0].config.redis_password == "x"
