"""The gRPC tests of tests/e2e/test_server_workers.py (two workers on SO_REUSEPORT answering gRPC over one copy of the weights) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_workers import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_two_workers_share_the_weights_and_metrics",
))
