"""The ``grpc_server`` deployment key (issue 50): "auto" (the default: native where it is built,
else python), "python" or "native", validated strictly; "native" without the native server built
is a start-up ConfigError naming the key, as is "native" with ``max_connections`` set (which
"auto" answers with the Python server).
(The servers themselves: tests/e2e/test_grpc_native_server.py.)"""

from __future__ import annotations

import sys

import pytest

from processor.errors import ConfigError
from sp_checks import toy_deployment as deployment


def test_auto_is_the_default_and_python_and_native_are_accepted():
    assert deployment().grpc_server == "auto"
    assert deployment(grpc_server="native").grpc_server == "native"
    assert deployment(grpc_server="python").grpc_server == "python"


def test_auto_picks_the_native_server_where_it_is_built():
    pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built")
    from server.app import ServingApp

    for choice, kind in (("auto", "native"), ("python", "python"), ("native", "native")):
        app = ServingApp(deployment(grpc_server=choice))
        assert app.grpc_server == kind, choice
        app.runtime.close()


def test_a_connection_cap_is_served_by_the_python_server_or_refused_for_native():
    """Only the Python server enforces max_connections (gRPC 1.51's C++ server has no cap): a
    deployment that sets it gets the Python server for "auto" and a ConfigError naming the key for
    "native", never a cap silently not kept."""
    pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built")
    from server.app import ServingApp

    app = ServingApp(deployment(max_connections=100))
    assert app.grpc_server == "python"
    app.runtime.close()
    with pytest.raises(ConfigError) as info:
        ServingApp(deployment(grpc_server="native", max_connections=100))
    assert info.value.message.startswith("grpc_server") and "max_connections" in info.value.message
    app = ServingApp(deployment(grpc_server="native", max_connections=100, grpc_port=None))  # no gRPC port
    assert app.grpc_server == "native"
    app.runtime.close()


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

    for choice in ("auto", "python"):  # auto: the Python server, where the native one is not built
        app = ServingApp(deployment(grpc_server=choice))
        assert app.grpc_server == "python", choice
        app.runtime.close()


def test_tls_on_the_native_server_loaded_after_tensorflow_is_refused_not_a_crash():
    """TensorFlow exports its BoringSSL's symbols process-wide; gRPC's library loaded after it
    binds its OpenSSL calls to them and crashes making its first TLS context. A process that
    loaded TensorFlow first (python -m server never does: it loads the native server first) gets
    a ConfigError for "native" with TLS, and the Python server for "auto"."""
    import subprocess

    pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built")
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed")
    script = """
import tensorflow
from processor.errors import ConfigError
from server.grpc.native_server import grpc_server_kind
print(grpc_server_kind("auto", True, tls=True), grpc_server_kind("auto", True, tls=False))
try:
    grpc_server_kind("native", True, tls=True)
except ConfigError as exc:
    print(exc.message.split(":")[0])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["python", "native", "grpc_server"], out.stdout
