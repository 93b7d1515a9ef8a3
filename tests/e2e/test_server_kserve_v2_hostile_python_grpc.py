"""The gRPC tests of tests/e2e/test_server_kserve_v2_hostile.py (hostile v2 gRPC requests (shapes, versions, bytes that are not a message, bf16, bool bytes, names echoed cut, bytes elements)) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_kserve_v2_hostile import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_shapes_numpy_cannot_build_are_400",
    "test_malformed_versions_are_invalid_argument_on_grpc",
    "test_readiness_of_a_version_not_served_is_404_like_metadata",
    "test_grpc_bytes_that_are_not_a_message_are_invalid_argument",
    "test_bf16_inputs_and_outputs_over_every_transport",
    "test_raw_bool_bytes_other_than_0_and_1_are_400",
    "test_client_names_are_echoed_cut",
    "test_bytes_elements_beyond_the_shape_are_refused",
))
