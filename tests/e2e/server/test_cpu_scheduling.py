"""``cpu_scheduling`` (server/cpu_policy.py) with a real server process on the native gRPC server.
``"batch"``, alone or as ``workers: 2``: every thread of each serving process (the engine's pools
and batch threads, the gRPC and HTTP servers' threads, made before and after the models load) is
under Linux's SCHED_BATCH. ``"io_batch"`` (the default): gRPC's own threads are, the rest (the
interpreter's, the engine's and the batch threads, named after the process) keep the normal
policy. Either way it answers as before."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from demo import dlrm_onnx
from processor import codec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")

SCHED_OTHER, SCHED_BATCH = 0, 3  # linux/sched.h


def policies(pid: int) -> dict[str, int]:
    """Each thread's scheduling policy (field 41 of /proc/<pid>/task/<tid>/stat), by tid and name."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended since the listing
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        out[f"{task.name} {name}"] = int(fields[38])  # fields[0] is field 3 (state)
    return out


def serving_pids(pid: int) -> list[int]:
    """``pid`` and, for a supervisor (``workers`` > 1), its worker processes."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, children)]


@pytest.mark.parametrize("policy, workers", [("batch", 1), ("batch", 2), ("io_batch", 1)])
def test_the_server_threads_policy(tmp_path, policy, workers):
    from tools.server_process import ServerProcess

    dlrm_onnx.build(tmp_path / "dlrm" / "model.onnx", rows=500, dim=8)
    deployment = {"models": [{"name": "dlrm", "model_config": {
        "savedmodel_dir": str(tmp_path / "dlrm"), "backend": "onnxruntime", "session_num": 2,
        "use_per_session_threads": True, "intra_op_parallelism_threads": 2,
        "batching": {"max_batch_size": 16, "batch_timeout_micros": 0, "num_batch_threads": 2}}}],
        "cpu_scheduling": policy, "access_log": False, "workers": workers, "grpc_server": "native"}
    with ServerProcess(deployment, tmp_path / "server").start(timeout=120) as server:
        feeds = dlrm_onnx.inputs(3, seed=2)
        body = codec.encode_request(feeds)
        request = urllib.request.Request(f"{server.http}/api/predict/dlrm", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            over_http = codec.decode_response(resp.read())["prob"]
        with grpc.insecure_channel(server.grpc_target) as channel:
            answer = channel.unary_unary("/tensorflow.eas.ProcessorService/Predict")(
                body, metadata=(("model-name", "dlrm"),), timeout=30)
        np.testing.assert_allclose(codec.decode_response(answer)["prob"], over_http, rtol=1e-5, atol=1e-6)
        pids = serving_pids(server.proc.pid)
        assert len(pids) == (1 if workers == 1 else 1 + workers), pids
        for pid in pids[1:] if workers > 1 else pids:  # each process that serves (not the supervisor)
            seen = policies(pid)
            assert len(seen) > 4, seen  # the engine's and the servers' threads are there
            if policy == "batch":
                assert all(p == SCHED_BATCH for p in seen.values()), seen
                continue
            # gRPC names its threads (nexting_thread, default-executo, timer_manager, ...); the
            # others take the process's name
            grpc_threads = {k: p for k, p in seen.items() if not k.endswith(" python")}
            assert any(k.endswith(" nexting_thread") for k in grpc_threads), seen
            assert all(p == SCHED_BATCH for p in grpc_threads.values()), seen
            assert all(p == SCHED_OTHER for k, p in seen.items() if k not in grpc_threads), seen
    assert os.sched_getscheduler(0) != SCHED_BATCH  # the test's own process is left as it was
