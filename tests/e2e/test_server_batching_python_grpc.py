"""tests/e2e/test_server_batching.py (server-side batching over real sockets: concurrent clients
on every transport, a bad request in a crowd, deadlines, a full queue, the batching metrics,
SIGTERM draining the queue) run again with the Python gRPC server (issue 50,
``grpc_server: "python"``; the module itself runs on the default, the native server, whose
direct path takes the Predicts on the ONNX Runtime models' native queues)."""

from __future__ import annotations

import sp_checks
from test_server_batching import *  # noqa: F401,F403 - the module's tests and fixtures, run here again

python_grpc_server = sp_checks.python_grpc_rerun()
