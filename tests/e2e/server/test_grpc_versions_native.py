"""tests/e2e/server/test_grpc_versions.py (several versions over gRPC: TF Serving's stubs,
tritonclient, our ProcessorService with version metadata, routing keys, labels moving) run again
against the native gRPC server (issue 50, ``grpc_server: "native"``): every call there goes
through its bridge into the same Python handlers (the model does not batch)."""

from __future__ import annotations

import pytest

import sp_checks

pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built (libgrpc++-dev missing)")

from test_grpc_versions import *  # noqa: E402,F401,F403 - the module's tests and fixtures, run here again


@pytest.fixture(scope="module", autouse=True)
def native_grpc_server():
    with sp_checks.native_grpc_servers():
        yield


def test_the_native_server_served_these_calls(server):
    sp_checks.assert_served_natively(server)
