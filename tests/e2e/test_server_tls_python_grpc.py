"""The gRPC tests of tests/e2e/test_server_tls.py (TLS and mutual TLS over gRPC (TF Serving's stub, tritonclient, plaintext clients refused, the health port, certificate rotation, the in-process client-certificate and TLS 1.3 checks)) run again against the Python gRPC server
(issue 50, ``grpc_server: "python"``; the module itself runs on the default, the native server).
Its tests that speak only HTTP are left out."""

from __future__ import annotations

import sp_checks
from test_server_tls import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun(globals(), only=(
    "test_tf_serving_stub_over_tls",
    "test_tritonclient_over_tls",
    "test_plaintext_clients_to_tls_ports_fail_cleanly",
    "test_plaintext_migration_ports_and_the_health_port",
    "test_rotated_certificate_is_presented_without_failed_requests",
    "test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca",
    "test_minimum_version_13_refuses_a_tls12_client",
))
