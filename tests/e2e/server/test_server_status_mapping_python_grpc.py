"""The gRPC tests of tests/e2e/server/test_server_status_mapping.py (one error code meaning the same on every edge, gRPC's included) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_status_mapping import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_code_means_the_same_on_every_edge",
))
