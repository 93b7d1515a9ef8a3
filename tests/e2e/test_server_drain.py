"""SIGTERM under load: in-flight requests complete, new ones are refused, the process exits in time.

Slow requests are real ones: the toy model with a few million rows (receiving, decoding, running
and encoding take about 0.1 s each), sent concurrently over our HTTP endpoint.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import model_config
from processor import codec

ROWS = 4_000_000


def deployment(toy_model, drain_timeout: float) -> dict:
    return {"models": [{"name": "toy", "model_config": model_config(toy_model), "inference_threads": 2}],
            "max_request_bytes": 64 << 20, "drain_timeout_seconds": drain_timeout, "access_log": False}


def post(url: str, body: bytes, timeout: float = 60) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def in_flight(server) -> float:
    with urllib.request.urlopen(server.http + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(r'^sp_requests_in_flight\{protocol="http"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def start_slow_requests(server, count: int) -> tuple[list, list[threading.Thread]]:
    body = codec.encode_request({"x": np.ones((ROWS, 1), np.float32)})
    results: list = []

    def send() -> None:
        try:
            results.append(post(server.http + "/api/predict/toy", body))
        except Exception as exc:  # recorded, asserted below
            results.append(exc)

    threads = [threading.Thread(target=send) for _ in range(count)]
    for t in threads:
        t.start()
    # wait until every request is admitted (a request arriving after SIGTERM is refused) and some
    # are still in flight: on a busy machine the first may finish before the last is admitted.
    # Answers are counted before the gauge is read: the server lowers the gauge before it answers,
    # so no request is counted twice
    deadline = time.monotonic() + 30
    while True:
        done = len(results)
        flying = in_flight(server)
        if done + flying >= count and flying >= 1:
            return results, threads
        assert done < count, "every slow request finished before one was seen in flight"
        assert time.monotonic() < deadline, "the slow requests never reached the server"
        time.sleep(0.01)


def wait_draining(server, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(server.http + "/readyz", timeout=5)
        except urllib.error.HTTPError as err:
            if err.code == 503 and json.loads(err.read())["draining"] is True:
                return
        assert time.monotonic() < deadline, "the server did not start draining"
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_sigterm_drains_in_flight_refuses_new_and_exits(toy_model, tmp_path):
    from tools.server_process import ServerProcess

    drain_timeout = 20.0
    server = ServerProcess(deployment(toy_model, drain_timeout), tmp_path).start(timeout=120)
    channel = grpc.insecure_channel(server.grpc_target)
    try:
        small = codec.encode_request({"x": np.array([[1.0]], np.float32)})
        assert post(server.http + "/api/predict/toy", small)[0] == 200
        results, threads = start_slow_requests(server, 4)

        server.terminate()
        wait_draining(server)  # readiness turns 503 as soon as the signal is handled
        # new requests are refused while the in-flight ones finish
        status, body = post(server.http + "/api/predict/toy", small)
        assert status == 503 and "shutting down" in json.loads(body)["error"]
        with urllib.request.urlopen(server.http + "/healthz", timeout=5) as resp:
            assert resp.status == 200  # alive while draining
        from processor.proto import predict_pb2, processor_service_pb2_grpc

        with pytest.raises(grpc.RpcError) as info:
            processor_service_pb2_grpc.ProcessorServiceStub(channel).Predict(
                predict_pb2.PredictRequest.FromString(small), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        for t in threads:
            t.join(60)
        rc = server.proc.wait(drain_timeout + 10)  # a hang detector; exit 0 (below) says: drained in time
    finally:
        channel.close()
        server.kill()

    assert len(results) == 4
    for result in results:  # every in-flight request completed, with the right values
        assert not isinstance(result, Exception), result
        status, body = result
        assert status == 200, body[:200]
        y = codec.decode_response(body)["y"]
        assert y.shape == (ROWS, 1) and y[0, 0] == 2.5 and y[-1, 0] == 2.5
    assert rc == 0, server.log()  # 1 would mean the drain timeout cut requests off
    log = server.log()
    assert "SIGTERM received: draining" in log and "drained" in log


@pytest.mark.timeout(120)
def test_drain_timeout_cuts_off_and_exits_in_time(toy_model, tmp_path):
    from tools.server_process import ServerProcess

    drain_timeout = 0.01  # far below one 4M-row request (the native codec made them ~0.1 s)
    server = ServerProcess(deployment(toy_model, drain_timeout), tmp_path).start(timeout=120)
    try:
        _, threads = start_slow_requests(server, 3)
        server.terminate()
        # A hang detector (the teardown takes about a second): raises TimeoutExpired if the
        # process outlives the drain timeout by far.
        rc = server.proc.wait(30)
        for t in threads:
            t.join(60)
    finally:
        server.kill()
    assert rc == 1, server.log()  # requests were cut off
    assert "drain timeout" in server.log()


def test_port_in_use_exits_2_with_a_clear_message(tmp_path):
    import socket
    import subprocess
    import sys

    from tools.server_process import REPO_ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = tmp_path / "d.json"
        config.write_text(json.dumps({"models": [{"name": "m", "model_config": {"savedmodel_dir": str(tmp_path)}}],
                                      "host": "127.0.0.1", "http_port": port, "grpc_port": 0}))
        out = subprocess.run([sys.executable, "-m", "server", "--config", str(config)], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"cannot bind the HTTP port 127.0.0.1:{port}" in out.stderr  # the run's timeout: a hang detector
