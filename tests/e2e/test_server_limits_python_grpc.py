"""The gRPC tests of tests/e2e/test_server_limits.py (gRPC metadata over the limit and the empty Predict as the ping) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_limits import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_grpc_metadata_over_the_limit_is_refused",
    "test_empty_grpc_predict_is_the_ping_as_on_http_and_the_c_abi",
))
