"""DeploymentConfig: the shape, defaults, and errors that name the key; configs/ examples."""

import json
from pathlib import Path

import pytest

from processor.config import ModelConfig
from server.settings import DeploymentConfig
from processor.errors import ConfigError, StatusCode

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted((ROOT / "configs").glob("*.json"))
MODEL = {"savedmodel_dir": "/models/toy/savedmodel"}


def deployment(**top) -> dict:
    return {"models": [{"name": "toy", "model_config": dict(MODEL)}], **top}


def test_defaults():
    d = DeploymentConfig.from_dict(deployment())
    assert (d.http_port, d.grpc_port, d.host) == (8080, 8500, "127.0.0.1")  # loopback unless widened
    assert d.max_request_bytes == 64 * 1024 * 1024 and d.drain_timeout_seconds == 30
    assert d.admin_token is None and d.resolved_admin_token() is None
    entry = d.models[0]
    assert entry.name == "toy" and isinstance(entry.config, ModelConfig)
    assert entry.config.savedmodel_dir == MODEL["savedmodel_dir"]
    assert entry.threads == 2  # two per session


def test_model_config_as_json_string_and_options():
    d = DeploymentConfig.from_dict({"models": [
        {"name": "a", "model_config": json.dumps({**MODEL, "session_num": 3, "token": "x"}),
         "version_labels": {"stable": 4}, "inference_threads": 5},
        {"name": "b.v2", "model_config": MODEL}]})
    a, b = d.models
    assert a.config.session_num == 3 and a.threads == 5 and a.version_labels == {"stable": 4}
    assert a.config.foreign_keys(a.raw_config) == ["token"]
    assert b.threads == 2 and d.model("b.v2") is b


@pytest.mark.parametrize("data, starts", [
    ({}, "models: required"),
    ({"models": []}, "models: required"),
    ({"models": "toy"}, "models: required"),
    ({"models": [42]}, "models[0]: expected an object"),
    ({"models": [{"model_config": MODEL}]}, "models[0].name: required"),
    ({"models": [{"name": "toy"}]}, "models[0] 'toy'.model_config: required"),
    ({"models": [{"name": "a b", "model_config": MODEL}]}, "models[0] 'a b'.name:"),
    ({"models": [{"name": "toy", "model_config": MODEL, "labels": {}}]},
     "models[0] 'toy'.labels: unknown deployment key; did you mean 'version_labels'?"),
    ({"models": [{"name": "toy", "model_config": {**MODEL, "sesion_num": 2}}]},
     "models[0] 'toy'.model_config.sesion_num: unknown model_config key; did you mean 'session_num'?"),
    ({"models": [{"name": "toy", "model_config": {**MODEL, "session_num": 0}}]},
     "models[0] 'toy'.model_config.session_num:"),
    ({"models": [{"name": "toy", "model_config": "{nope"}]}, "models[0] 'toy'.model_config: not valid JSON"),
    ({"models": [{"name": "toy", "model_config": MODEL, "version_labels": {"a-b": 1}}]},
     "models[0] 'toy'.version_labels: label 'a-b'"),
    ({"models": [{"name": "toy", "model_config": MODEL, "inference_threads": 0}]},
     "models[0] 'toy'.inference_threads:"),
    ({"models": [{"name": "toy", "model_config": MODEL}] * 2}, "models[1].name: model name 'toy' is used twice"),
    (deployment(http_prot=1), "http_prot: unknown deployment key; did you mean 'http_port'?"),
    (deployment(http_port=70000), "http_port:"),
    (deployment(max_request_bytes="big"), "max_request_bytes:"),
    (deployment(http_port=None, grpc_port=None), "http_port: both"),
    (deployment(admin_token="short"), "admin_token:"),
    (deployment(admin_token="long-enough", admin_token_env="X"), "admin_token: give"),
    (deployment(log_format="xml"), "log_format:"),
    (deployment(drain_timeout_seconds=-1), "drain_timeout_seconds:"),
])
def test_errors_name_the_key(data, starts):
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_dict(data)
    assert info.value.message.startswith(starts), info.value.message
    assert info.value.code == StatusCode.INVALID_ARGUMENT


def test_from_json_and_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="^deployment config: not valid JSON"):
        DeploymentConfig.from_json("{")
    with pytest.raises(ConfigError, match="^deployment config: expected a JSON object"):
        DeploymentConfig.from_json("[]")
    with pytest.raises(ConfigError, match="cannot read"):
        DeploymentConfig.from_file(tmp_path / "missing.json")
    path = tmp_path / "d.json"
    path.write_text(json.dumps(deployment(grpc_port=None)))
    assert DeploymentConfig.from_file(path).grpc_port is None


def test_admin_token_from_environment(monkeypatch):
    d = DeploymentConfig.from_dict(deployment(admin_token_env="SP_TEST_TOKEN"))
    monkeypatch.delenv("SP_TEST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="^admin_token_env: environment variable 'SP_TEST_TOKEN'"):
        d.resolved_admin_token()
    monkeypatch.setenv("SP_TEST_TOKEN", "from-env-123")
    assert d.resolved_admin_token() == "from-env-123"


def test_redacted_masks_secrets():
    d = DeploymentConfig.from_dict({**deployment(admin_token="super-secret"), "models": [
        {"name": "r", "model_config": {**MODEL, "feature_store_type": "redis",
                                       "redis_url": "redis://h:6379", "redis_password": "pw"}}]})
    text = json.dumps(d.redacted())
    assert "super-secret" not in text and '"pw"' not in text


def test_processor_never_imports_transports():
    import ast

    import server.settings as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not imported & {"fastapi", "starlette", "uvicorn", "grpc", "server"}


def test_examples_cover_the_documented_cases():
    names = {p.stem for p in CONFIGS}
    assert {"single_model_cpu", "session_group_cpusets", "gpu_multi_stream", "multi_model", "redis"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_example_configs_validate(path):
    d = DeploymentConfig.from_file(path)
    assert d.models
    if path.stem == "gpu_multi_stream":
        cfg = d.models[0].config
        assert cfg.gpu_ids_list == (0, 1) and cfg.use_multi_stream and len(cfg.cpusets) == 4
    if path.stem == "session_group_cpusets":
        cfg = d.models[0].config
        assert cfg.use_per_session_threads and len(cfg.cpusets) == cfg.session_num
    if path.stem == "multi_model":
        assert [m.name for m in d.models] == ["ctr", "toy"]
    if path.stem == "redis":
        assert d.models[0].config.feature_store_type in ("redis", "cluster_redis")
