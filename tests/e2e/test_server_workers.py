"""workers: N (issue 24): a supervisor and N server processes on the same ports, real processes
and loopback ports, the DLRM-like ``.onnx`` model on ONNX Runtime.

Two workers serve one port each of HTTP and gRPC and share one copy of the parameters in
``/dev/shm``; ``/metrics`` counts the requests of both; a worker killed with SIGKILL is restarted
while the other keeps answering; nothing is left in ``/dev/shm`` after a stop, and the files of a
server whose supervisor was killed are removed by the next server's start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from demo import dlrm_onnx
from processor import codec, shared_segments
from sp_checks import assert_outputs_close, wait_for

SHM = shared_segments.default_directory()


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dlrm_workers")
    dlrm_onnx.build(directory / "model.onnx", rows=2000, dim=8)
    return directory


def deployment(dlrm_dir: Path, workers: int = 2) -> dict:
    config = {"savedmodel_dir": str(dlrm_dir), "backend": "onnxruntime", "session_num": 1,
              "file_system_poll_wait_seconds": 0}
    return {"models": [{"name": "dlrm", "model_config": config}], "workers": workers,
            "access_log": False, "drain_timeout_seconds": 10}


def predict(server, inputs: dict[str, np.ndarray], model: str = "dlrm") -> dict[str, np.ndarray]:
    request = urllib.request.Request(server.http + f"/api/predict/{model}", data=codec.encode_request(inputs))
    with urllib.request.urlopen(request, timeout=30) as resp:  # a new connection each call
        return codec.decode_response(resp.read())


def server_files(pid: int) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"{shared_segments.PREFIX}{pid}[-.]*"))


def shared_memory_info(server) -> dict:
    info = server.get_json("/api/models/dlrm")
    found: list = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("shared_memory"), dict):
                found.append(node["shared_memory"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(info)
    assert found, f"no shared_memory in model info: {json.dumps(info)[:400]}"
    return found[0]


def requests_counted(server) -> float:
    with urllib.request.urlopen(server.http + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    lines = [line for line in text.splitlines() if line.startswith("sp_requests_total{")
             and 'model="dlrm"' in line and 'api="model_info"' not in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def gone(pid: int) -> bool:
    """``pid`` has exited and was reaped (the supervisor reaps its workers): every thread is gone,
    so its sockets are closed. (A zombie leader is not enough: its other threads may still be
    exiting with the listening socket open, and a connection the kernel gives it is reset.)"""
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.timeout(300)
def test_two_workers_share_the_weights_and_metrics(dlrm_dir, tmp_path):
    from tools.server_process import ServerProcess

    inputs = dlrm_onnx.inputs(4)
    with ServerProcess(deployment(dlrm_dir), tmp_path) as server:
        pids = server.ports["workers"]
        assert len(pids) == 2 and server.ports["pid"] == server.proc.pid
        # one segment for the model's parameters, mapped by both workers (each created it or not)
        seen: dict[bool, dict] = {}
        for _ in range(200):
            shm = shared_memory_info(server)
            seen[shm["created_here"]] = shm
            if len(seen) == 2:
                break
        assert set(seen) == {True, False}, "model info never came from both workers"
        assert seen[True]["path"] == seen[False]["path"]
        assert Path(seen[True]["path"]).exists()
        assert [n for n in server_files(server.proc.pid) if n.endswith(".weights")] == [Path(seen[True]["path"]).name]

        first = predict(server, inputs)
        for _ in range(39):
            assert_outputs_close(predict(server, inputs), first)
        # gRPC on the shared port too (TF Serving's health: both workers answer SERVING)
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        for _ in range(6):
            with grpc.insecure_channel(server.grpc_target) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # /metrics is the whole server's, whichever worker answers the scrape
        for _ in range(6):
            assert requests_counted(server) == 40
        code = server.stop()
    assert code == 0, server.log()[-3000:]
    tagged = {json.loads(line).get("worker") for line in server.log().splitlines() if line.startswith("{")}
    assert set(pids) <= tagged  # each worker's log lines say which worker wrote them
    assert server_files(server.proc.pid) == []
    assert all(gone(pid) for pid in pids)


@pytest.mark.timeout(300)
def test_sigkill_of_a_worker_restarts_it_and_the_server_keeps_answering(dlrm_dir, tmp_path):
    from tools.server_process import ServerProcess

    inputs = dlrm_onnx.inputs(2)
    with ServerProcess(deployment(dlrm_dir), tmp_path) as server:
        expected = predict(server, inputs)
        victim, survivor = server.ports["workers"]
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: gone(victim), 30), "the worker did not die"
        for _ in range(20):  # the other worker answers meanwhile
            assert_outputs_close(predict(server, inputs), expected)
        ports_file = tmp_path / "ports.json"
        assert wait_for(lambda: victim not in json.loads(ports_file.read_text())["workers"], 120), \
            "the restarted worker never listened"
        workers = json.loads(ports_file.read_text())["workers"]
        assert survivor in workers and len(workers) == 2
        for _ in range(20):
            assert_outputs_close(predict(server, inputs), expected)
        assert re.search(rf"worker 0 \(pid {victim}\) died \(signal SIGKILL\)", server.log())
        # the restarted worker mapped the segment the others made (still one copy)
        assert len([n for n in server_files(server.proc.pid) if n.endswith(".weights")]) == 1
        assert server.stop() == 0
    assert server_files(server.proc.pid) == []


@pytest.mark.timeout(300)
def test_files_of_a_killed_server_are_removed_at_the_next_start(dlrm_dir, tmp_path):
    from tools.server_process import ServerProcess

    dead = ServerProcess(deployment(dlrm_dir), tmp_path / "dead").start()
    workers = dead.ports["workers"]
    dead.kill()  # SIGKILL of the supervisor: the workers get SIGTERM (parent-death signal)
    for pid in workers:
        assert wait_for(lambda pid=pid: gone(pid), 60), f"worker {pid} did not exit"
    assert server_files(dead.proc.pid), "the killed supervisor left nothing behind to clean"
    with ServerProcess(deployment(dlrm_dir), tmp_path / "next"):
        assert server_files(dead.proc.pid) == []


ADMIN_TOKEN = "workers-admin-token"


def toy_y(server, x: float = 1.0) -> float:
    return float(predict(server, {"x": np.array([[x]], np.float32)}, "toy")["y"].ravel()[0])


def every_worker_answers(server, y: float, calls: int = 30) -> bool:
    """``calls`` calls on fresh connections (the kernel spreads them over the workers) all give ``y``."""
    return all(abs(toy_y(server) - y) < 1e-5 for _ in range(calls))


def admin(server, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(server.http + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


@pytest.mark.timeout(600)
def test_full_update_and_admin_pin_reach_every_worker_under_load(tmp_path):
    """A new full version, a delta (written once into the shared parameters, for both workers),
    a pin and an unpin with 2 workers while requests keep coming: no request fails, every answer
    is one published version's, every worker serves a new version within poll + 2 s (a delta: of
    its publication; a full version, which the first worker converts: of the first worker
    serving it), every worker ends on the same one."""
    import threading

    from conftest import model_config
    from demo.toy_model import build_toy_model, write_toy_checkpoint
    from unit.features.helpers import publish_delta
    from tools.server_process import ServerProcess

    poll = 1
    paths = build_toy_model(tmp_path / "toy")
    config = model_config(paths, backend="onnxruntime", file_system_poll_wait_seconds=poll)
    dep = {"models": [{"name": "toy", "model_config": config}], "workers": 2, "admin_token": ADMIN_TOKEN,
           "access_log": False, "drain_timeout_seconds": 10}
    with ServerProcess(dep, tmp_path / "server") as server:
        assert every_worker_answers(server, 2.5)  # y = 0.5 x + 2
        answers: list[float] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    answers.append(toy_y(server))
                except BaseException as exc:  # asserted below
                    failures.append(exc)

        thread = threading.Thread(target=load)
        thread.start()
        try:
            write_toy_checkpoint(paths.run_dir, 2, 1.5, 4.0)  # y = 1.5 x + 4
            assert wait_for(lambda: abs(toy_y(server) - 5.5) < 1e-5, 120), "no worker took step 2"
            time.sleep(poll + 2)
            assert every_worker_answers(server, 5.5), "a worker took step 2 more than poll + 2 s after the first"
            publish_delta(paths.run_dir, 3, {"a": np.array(2.0, np.float32)})  # y = 2 x + 4, in place
            time.sleep(poll + 2)
            assert every_worker_answers(server, 6.0), "a worker took delta 3 more than poll + 2 s after it"
            assert admin(server, "PUT", "/admin/models/toy/pin", {"version": 1})["pinned"]
            assert wait_for(lambda: every_worker_answers(server, 2.5), 120), "the pin did not reach every worker"
            admin(server, "DELETE", "/admin/models/toy/pin")
            assert wait_for(lambda: every_worker_answers(server, 6.0), 120), "the unpin did not reach every worker"
        finally:
            stop.set()
            thread.join(60)
        assert not failures, failures[:3]
        assert answers and set(np.round(answers, 4)) <= {2.5, 5.5, 6.0}
        # delta 3 was written once per segment: one worker wrote it, the other found it there; at
        # the unpin again when the pin had let the segment go (else both found it)
        events = [line for line in server.log().splitlines() if "delta 3: " in line]
        assert len(events) == 4, events
        assert sum("written into" in e for e in events[:2]) == 1 and sum("written into" in e for e in events[2:]) <= 1, events
        # a worker that starts now replays the pin: pin again, kill one, the new one serves step 1
        admin(server, "PUT", "/admin/models/toy/pin", {"version": 1})
        assert wait_for(lambda: every_worker_answers(server, 2.5), 120)
        victim = server.ports["workers"][0]
        os.kill(victim, signal.SIGKILL)
        ports_file = tmp_path / "server" / "ports.json"
        assert wait_for(lambda: victim not in json.loads(ports_file.read_text())["workers"], 180)
        assert every_worker_answers(server, 2.5, calls=40)
        assert server.stop() == 0


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_start_stops_the_server(dlrm_dir, tmp_path):
    """A bad certificate file fails every worker before it listens: the server exits 2 naming the
    key (as one process does), leaving nothing in /dev/shm."""
    import subprocess
    import sys

    from tools.server_process import REPO_ROOT

    config = tmp_path / "deployment.json"
    config.write_text(json.dumps({**deployment(dlrm_dir), "tls_cert_file": str(tmp_path / "missing.pem"),
                                  "tls_key_file": str(tmp_path / "missing.key"), "http_port": 0, "grpc_port": 0}))
    proc = subprocess.Popen([sys.executable, "-m", "server", "--config", str(config)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=100)
    assert proc.returncode == 2, stderr[-2000:]
    assert "tls_cert_file" in stderr and "before it listened" in stderr
    assert server_files(proc.pid) == []


@pytest.mark.timeout(300)
def test_sigterm_drains_the_requests_in_flight_in_every_worker(toy_model, tmp_path):
    """Slow requests spread over 2 workers (sp_requests_in_flight sums the live workers), SIGTERM
    to the supervisor: every one completes with its answer, the server exits 0."""
    from tools.server_process import ServerProcess
    from test_server_drain import ROWS, deployment as drain_deployment, start_slow_requests

    server = ServerProcess({**drain_deployment(toy_model, 20.0), "workers": 2}, tmp_path).start(timeout=120)
    try:
        results, threads = start_slow_requests(server, 6)  # all 6 admitted (the summed gauge), some in flight
        server.terminate()
        for t in threads:
            t.join(60)
        rc = server.proc.wait(40)
    finally:
        server.kill()
    assert len(results) == 6
    for result in results:
        assert not isinstance(result, Exception), result
        status, body = result
        assert status == 200, body[:200]
        assert codec.decode_response(body)["y"].shape == (ROWS, 1)
    assert rc == 0, server.log()[-3000:]
    log = server.log()
    assert "draining 2 workers" in log and log.count("drained") >= 2
