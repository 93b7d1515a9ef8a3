"""The command line (``python -m server`` / ``serving-processor``), packaging and Docker files."""

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from server import __main__ as cli

ROOT = Path(__file__).resolve().parents[3]


def test_console_script_points_at_main():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["serving-processor"] == "server.__main__:main"
    assert callable(cli.main)


def test_check_validates_and_applies_overrides(capsys):
    assert cli.main(["--check", "--config", str(ROOT / "configs/multi_model.json"),
                     "--http-port", "0", "--grpc-port", "9000", "--host", "127.0.0.1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["http_port"], shown["grpc_port"], shown["host"]) == (0, 9000, "127.0.0.1")
    assert [m["name"] for m in shown["models"]] == ["ctr", "toy"]


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    (json.dumps({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/x", "sesion_num": 1}}]}),
     "models[0] 'm'.model_config.sesion_num: unknown model_config key"),
    (json.dumps({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/x"}}], "http_port": -1}),
     "http_port:"),
])
def test_bad_config_exits_2_naming_the_key(tmp_path, capsys, content, message):
    path = tmp_path / "d.json"
    path.write_text(content)
    assert cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("serving-processor: bad config:") and message in err


def test_config_that_is_not_utf8_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "d.json"
    path.write_bytes(b'{"models": [{"name": "caf\xe9"}]}')
    assert cli.main(["--config", str(path)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_missing_config_file(capsys, tmp_path):
    assert cli.main(["--config", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_admin_token_env_must_be_set_at_start(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SP_TEST_ADMIN", raising=False)
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/x"}}],
                                "admin_token_env": "SP_TEST_ADMIN", "http_port": 0, "grpc_port": 0}))
    assert cli.main(["--config", str(path)]) == 2
    assert "admin_token_env: environment variable 'SP_TEST_ADMIN'" in capsys.readouterr().err


def test_example_request_is_built_from_the_signature():
    signature = {"inputs": [{"name": "dense", "shape": [-1, 3], "type": "DT_FLOAT"},
                            {"name": "tokens", "shape": [-1, 2], "type": "DT_STRING"}]}
    app = SimpleNamespace(http_port=8080, deployment=SimpleNamespace(host="0.0.0.0"),
                          runtime=SimpleNamespace(dataplane=SimpleNamespace(
                                  served=lambda name: SimpleNamespace(signature=SimpleNamespace(describe=lambda: signature)))))
    curl = cli.example_request(app, "demo")
    body = json.loads(curl.split("-d '", 1)[1].rstrip("'"))
    assert curl.startswith("curl -s -X POST http://127.0.0.1:8080/v1/models/demo:predict")
    assert body == {"instances": [{"dense": [0, 0, 0], "tokens": ["a", "a"]}]}


def test_docker_images_use_the_readme_setup():
    cpu = (ROOT / "docker/Dockerfile.cpu").read_text()
    gpu = (ROOT / "docker/Dockerfile.gpu").read_text()
    for text in (cpu, gpu):
        assert "bash scripts/setup.sh" in text and "ENTRYPOINT [\"serving-processor\"]" in text
        assert "STOPSIGNAL SIGTERM" in text and "EXPOSE 8080 8500" in text
    assert "SP_EXTRAS=gpu,server" in gpu and "dev" not in gpu.split("SP_EXTRAS=")[1].split()[0]
    assert "SP_EXTRAS=cpu,server" in cpu and "dev" not in cpu.split("SP_EXTRAS=")[1].split()[0]
