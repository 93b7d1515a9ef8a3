"""The gRPC tests of tests/e2e/test_server_drain.py (SIGTERM draining gRPC calls in flight and refusing new ones) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_drain import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_sigterm_drains_in_flight_refuses_new_and_exits",
))
