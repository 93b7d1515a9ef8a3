"""The gRPC tests of tests/e2e/test_server_predict.py (our ProcessorService and TF Serving's over gRPC: every transport against process(), routing by name, an unready model, bad and oversized requests, status and metadata, request ids) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_predict import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_every_transport_equals_process",
    "test_two_models_routed_by_name_unknown_is_not_found",
    "test_model_with_missing_files_is_unready_while_others_serve",
    "test_bad_grpc_requests",
    "test_oversized_requests_refused_on_both_transports",
    "test_tf_serving_status_and_metadata",
    "test_metrics_request_ids_openapi",
))
