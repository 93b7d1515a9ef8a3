"""tests/e2e/test_server_batching.py (server-side batching over real sockets: concurrent clients
on every transport, a bad request in a crowd, deadlines, a full queue, the batching metrics,
SIGTERM draining the queue) run again with the Python gRPC server (issue 50,
``grpc_server: "python"``; the module itself runs on the default, the native server, whose
direct path takes the Predicts on the ONNX Runtime models' native queues)."""

from __future__ import annotations

import pytest

import sp_checks
from test_server_batching import *  # noqa: F401,F403 - the module's tests and fixtures, run here again


@pytest.fixture(scope="module", autouse=True)
def python_grpc_server():
    with sp_checks.grpc_servers("python"):
        yield


def test_the_python_server_served_these_calls(server):
    sp_checks.assert_grpc_served_by(server, "python")
