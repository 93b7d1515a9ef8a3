"""The ``grpc_server`` deployment key (issue 50): "python" (the default) or "native", validated
strictly; "native" without the native server built is a start-up ConfigError naming the key.
(The servers themselves: tests/e2e/test_grpc_native_server.py.)"""

from __future__ import annotations

import sys

import pytest

from processor.errors import ConfigError
from server.settings import DeploymentConfig

MODEL = {"savedmodel_dir": "/models/toy/savedmodel"}


def deployment(**top) -> DeploymentConfig:
    return DeploymentConfig.from_dict({"models": [{"name": "toy", "model_config": dict(MODEL)}], **top})


def test_python_is_the_default_and_native_is_accepted():
    assert deployment().grpc_server == "python"
    assert deployment(grpc_server="native").grpc_server == "native"


@pytest.mark.parametrize("value", ["Native", "c++", "", True, 1, None])
def test_anything_else_is_a_config_error_naming_the_key(value):
    with pytest.raises(ConfigError) as info:
        deployment(grpc_server=value)
    assert info.value.message.startswith("grpc_server"), info.value.message


def without_the_library(monkeypatch) -> None:
    import server.grpc

    monkeypatch.setitem(sys.modules, "server.grpc._native_grpc", None)  # its import fails
    monkeypatch.delattr(server.grpc, "_native_grpc", raising=False)


def test_native_without_the_library_is_a_start_up_error_naming_the_key(monkeypatch):
    without_the_library(monkeypatch)
    from server.app import ServingApp
    from server.grpc.native_server import native_module

    with pytest.raises(ConfigError) as info:
        native_module()
    assert 'grpc_server: "native"' in info.value.message and "libgrpc++-dev" in info.value.message
    with pytest.raises(ConfigError) as info:
        ServingApp(deployment(grpc_server="native"))
    assert info.value.message.startswith("grpc_server")
    # no gRPC port, no native server needed
    app = ServingApp(deployment(grpc_server="native", grpc_port=None))
    app.runtime.close()


def test_the_python_server_needs_no_native_library(monkeypatch):
    without_the_library(monkeypatch)
    from server.app import ServingApp

    app = ServingApp(deployment())
    app.runtime.close()
