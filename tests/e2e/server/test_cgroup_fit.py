"""The fit check in a real memory cgroup (issue 43): the server runs in a cgroup of 2 GiB of its
own (a child of this process's, made here where the machine allows it) with the default
``memory_limit`` (0.9 of the cgroup's limit, found from ``/proc/self/cgroup`` and the cgroup's
files: ``processor/memory.py``). A new full version whose parameters would not fit (an ``.onnx``
model whose external data file holds 3 GiB) is refused by name before it is read, the served
version answers every request throughout, and no process is OOM-killed.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
import time
from pathlib import Path

import pytest

from demo import dlrm_onnx
from processor import codec, memory
from sp_checks import wait_for

GIB = 1 << 30
LIMIT = 2 * GIB


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A memory cgroup of ``limit`` bytes under this process's own (v2, else v1): its directory.
    Skips where none can be made (no root, a read-only cgroup mount, no memory controller)."""
    own = memory._own_cgroups()  # noqa: SLF001 - the same reading the server makes
    name = f"sp-fit-{os.getpid()}"
    v2_root = Path(memory.CGROUP_ROOT)
    attempts = []
    if "v2" in own and (v2_root / "cgroup.controllers").exists():
        attempts.append((v2_root / own["v2"].lstrip("/") / name, "memory.max"))
    if "v1" in own and (v2_root / "memory").is_dir():
        attempts.append((v2_root / "memory" / own["v1"].lstrip("/") / name, "memory.limit_in_bytes"))
    made, reasons = None, []
    for directory, limit_file in attempts:
        try:
            directory.mkdir()
        except OSError as exc:
            reasons.append(f"{directory}: {exc.strerror}")
            continue
        try:
            (directory / limit_file).write_text(str(limit))
            made = directory
            break
        except OSError as exc:
            reasons.append(f"{directory / limit_file}: {exc.strerror}")
            directory.rmdir()
    if made is None:
        pytest.skip(f"cannot make a memory cgroup here ({'; '.join(reasons) or 'no cgroup mount'}); "
                    f"tests/integration/test_memory_budget.py checks the same with memory_limit")
    try:
        yield made
    finally:
        for _ in range(50):  # empty once the server's process is gone
            try:
                made.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def oversized_version(directory: Path) -> None:
    """A valid DLRM-like ``.onnx`` version whose tables live in an external data file sized
    3 GiB (sparse: nothing is written past the real tables, and nothing is read before the
    fit check refuses it)."""
    import onnx
    from onnx import TensorProto

    dlrm_onnx.build(directory / "model.onnx", rows=2000, dim=8, seed=2)
    model = onnx.load(str(directory / "model.onnx"))
    (tables,) = [t for t in model.graph.initializer if t.name == "tables"]
    raw = onnx.numpy_helper.to_array(tables).tobytes()
    with open(directory / "tables.bin", "wb") as f:
        f.write(raw)
        f.truncate(3 * GIB)
    tables.ClearField("raw_data")
    tables.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "tables.bin"), ("offset", "0"), ("length", str(len(raw)))):
        tables.external_data.add(key=key, value=value)
    onnx.save(model, str(directory / "model.onnx"))


def test_a_version_over_the_cgroup_is_refused_and_the_served_one_answers(tmp_path):
    from tools.server_process import ServerProcess

    base = tmp_path / "dlrm"
    dlrm_onnx.build(base / "1" / "model.onnx", rows=2000, dim=8, seed=1)
    with memory_cgroup(LIMIT) as cgroup:
        procs = cgroup / "cgroup.procs"
        deployment = {"models": [{"name": "dlrm", "model_config": {
            "savedmodel_dir": str(base), "backend": "onnxruntime", "session_num": 1,
            "file_system_poll_wait_seconds": 0.2}}], "access_log": False}
        server = ServerProcess(deployment, tmp_path / "server",
                               prefix=["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]).start(timeout=240)
        try:
            assert str(server.proc.pid) in procs.read_text().split()
            budget = server.get_json("/api/memory")["budget"]
            assert abs(budget["limit_bytes"] - 0.9 * LIMIT) <= 1, budget  # the cgroup's, found by the server
            body = codec.encode_request(dlrm_onnx.inputs(2, seed=3))
            statuses, versions, stop = [], set(), threading.Event()

            def load():
                conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
                while not stop.is_set():
                    conn.request("POST", "/api/predict/dlrm", body=body,
                                 headers={"Content-Type": "application/octet-stream"})
                    resp = conn.getresponse()
                    resp.read()
                    statuses.append(resp.status)
                    versions.add(resp.getheader("X-Model-Version"))
                conn.close()
            thread = threading.Thread(target=load)
            thread.start()
            try:
                staging = tmp_path / "staging"
                oversized_version(staging)
                staging.rename(base / "2")

                def refused():
                    failed = server.get_json("/api/models/dlrm").get("failed_versions") or []
                    return any("would not fit the memory limit" in f["error"] for f in failed)
                assert wait_for(refused, timeout=60), server.get_json("/api/models/dlrm")
                time.sleep(1.0)  # the served version keeps answering after the refusal
            finally:
                stop.set()
                thread.join(30)
            (failure,) = [f for f in server.get_json("/api/models/dlrm")["failed_versions"]]
            assert failure["version"] == "2" and "model 'dlrm' version 2" in failure["error"], failure
            assert statuses and set(statuses) == {200} and versions == {"1"}, (set(statuses), versions)
            assert server.proc.poll() is None  # alive: nothing OOM-killed
            oom = cgroup / "memory.oom_control"
            if oom.exists():
                assert "oom_kill 0" in oom.read_text() or "oom_kill " not in oom.read_text()
            events = cgroup / "memory.events"
            if events.exists():
                assert "oom_kill 0" in events.read_text()
        finally:
            assert server.stop(timeout=30) == 0, server.log()[-3000:]
