"""tests/e2e/test_server_batching.py (server-side batching over real sockets: concurrent clients
on every transport, a bad request in a crowd, deadlines, a full queue, the batching metrics,
SIGTERM draining the queue) run again with the native gRPC server (issue 50,
``grpc_server: "native"``): our Predict without a deadline takes its direct path on the ONNX
Runtime models' native queues; everything else goes through its bridge."""

from __future__ import annotations

import pytest

import sp_checks

pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built (libgrpc++-dev missing)")

from test_server_batching import *  # noqa: E402,F401,F403 - the module's tests and fixtures, run here again


@pytest.fixture(scope="module", autouse=True)
def native_grpc_server():
    with sp_checks.native_grpc_servers():
        yield


def test_the_native_server_served_these_calls(server):
    sp_checks.assert_served_natively(server)
