"""tests/e2e/server/test_grpc_versions.py (several versions over gRPC: TF Serving's stubs,
tritonclient, our ProcessorService with version metadata, routing keys, labels moving) run again
against the Python gRPC server (issue 50, ``grpc_server: "python"``; the module itself runs on the
default, the native server, whose bridge takes every call here: the model does not batch)."""

from __future__ import annotations

import sp_checks
from test_grpc_versions import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun()
