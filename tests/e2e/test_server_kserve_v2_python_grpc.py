"""The gRPC tests of tests/e2e/test_server_kserve_v2.py (tritonclient gRPC against process(), v2 health and metadata, and v2 gRPC error codes) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_kserve_v2 import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_tritonclient_grpc_infer_equals_process",
    "test_health_and_metadata_match_the_signature",
    "test_unknown_model_or_version_is_404_and_grpc_errors_map",
))
