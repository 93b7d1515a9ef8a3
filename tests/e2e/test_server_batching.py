"""Server-side batching (issue 13) over real sockets: ``python -m server`` on 127.0.0.1 ports.

One server per backend (ONNX Runtime: the native engine queue; TensorFlow: the Python batcher)
serves three batching models:

* ``demo``: the demo CTR model (small preset), batching on; many concurrent clients over our HTTP,
  our gRPC, TF Serving REST and TF Serving gRPC get what an unbatched Processor answers, and
  requests are merged (model info ``requests > batches``);
* ``slow``: the toy model with a 1.5 s batch timeout (deadlines: 504 / DEADLINE_EXCEEDED);
* ``tiny``: the toy model with room for 4 queued rows (a full queue: 503 / UNAVAILABLE).

SIGTERM drains the queue (every queued request answered 200, exit 0) on a server of its own.
"""

from __future__ import annotations

import json
import re
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import model_config
from processor import codec
from sp_checks import assert_outputs_close
from test_server_predict import call, call_json, demo_inputs, grpc_error, ours_grpc, ours_http, rest_columns, tfs_grpc

BACKENDS = ["onnxruntime", "tensorflow"]


def backend_config(paths, backend: str, **overrides) -> dict:
    """model_config for ``paths`` on ``backend`` (ONNX Runtime: per-session pools, as the ORT tests)."""
    extra = {"backend": "onnxruntime", "use_per_session_threads": True} if backend == "onnxruntime" else {}
    return model_config(paths, **extra, **overrides)


def batching(**overrides) -> dict:
    return {"max_batch_size": 64, "batch_timeout_micros": 20_000, "max_enqueued_batches": 100,
            "num_batch_threads": 2, "allowed_batch_sizes": [8, 32, 64],
            "pad_variable_length_inputs": False, **overrides}


def toy_x(values) -> dict[str, np.ndarray]:
    return {"x": np.asarray(values, np.float32).reshape(-1, 1)}


def toy_y(values) -> list[list[float]]:
    return [[0.5 * v + 2.0] for v in values]


def batching_info(server, name: str) -> dict:
    status, body = call_json(server, "GET", f"/api/models/{name}")
    assert status == 200, body
    return body["batching"]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def run_threads(targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a client thread hung"


def post_protobuf(server, name: str, inputs, headers: dict | None = None) -> tuple[int, bytes]:
    status, _, body = call(server, "POST", f"/api/predict/{name}", codec.encode_request(inputs), headers=headers)
    return status, body


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(backend, toy_model, ctr_model_small, tmp_path_factory):
    from tools.server_process import ServerProcess

    work = tmp_path_factory.mktemp(f"batching-{backend}")
    deployment = {
        "models": [
            {"name": "demo", "model_config": backend_config(ctr_model_small, backend, session_num=2,
                                                            batching=batching())},
            {"name": "slow", "model_config": backend_config(toy_model, backend, batching=batching(
                max_batch_size=64, batch_timeout_micros=1_500_000, allowed_batch_sizes=[]))},
            {"name": "tiny", "model_config": backend_config(toy_model, backend, batching=batching(
                max_batch_size=4, max_enqueued_batches=1, batch_timeout_micros=1_000_000,
                num_batch_threads=1, allowed_batch_sizes=[]))},
        ],
        "drain_timeout_seconds": 10, "access_log": False,
    }
    proc = ServerProcess(deployment, work).start(timeout=300)
    try:
        assert proc.wait_models(120) == {"demo": "ready", "slow": "ready", "tiny": "ready"}, proc.log()
    except BaseException:
        proc.kill()
        raise
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.grpc_target)
    grpc.channel_ready_future(ch).result(timeout=30)
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def reference(backend, ctr_model_small):
    """An unbatched Processor on the same model and backend, in this process."""
    from processor.processor import Processor

    p = Processor.create("demo", json.dumps(backend_config(ctr_model_small, backend)))
    assert p.model_info().get("batching") is None
    yield p
    p.close()


def expected_outputs(reference, inputs) -> dict[str, np.ndarray]:
    status, body = reference.process(codec.encode_request(inputs))
    assert status == 200, body
    return codec.decode_response(body)


# --- 1. many concurrent clients, four transports ------------------------------------------------

TRANSPORTS = ("our HTTP", "our gRPC", "TF Serving REST", "TF Serving gRPC")


def predict_via(transport: str, server, channel, inputs) -> dict:
    if transport == "our HTTP":
        return ours_http(server, "demo", inputs)
    if transport == "our gRPC":
        return ours_grpc(channel, "demo", inputs)
    if transport == "TF Serving REST":
        outputs = rest_columns(server, "demo", inputs)
        assert isinstance(outputs, dict), outputs
        return outputs
    return tfs_grpc(channel, "demo", inputs)[1]


def test_concurrent_clients_on_every_transport_equal_unbatched(server, channel, reference, backend):
    before = batching_info(server, "demo")
    assert before["native_queue"] is True
    assert before["settings"]["max_batch_size"] == 64 and before["settings"]["allowed_batch_sizes"] == [8, 32, 64]

    clients, rounds = 24, 4  # each client: one request per transport, in a rotating order
    cases = {}
    for c in range(clients):
        for r in range(rounds):
            rows = 1 if (c + r) % 2 else 3
            inputs = demo_inputs(rows, seed=1000 + c * rounds + r)
            cases[c, r] = (TRANSPORTS[(c + r) % len(TRANSPORTS)], inputs, expected_outputs(reference, inputs))
    results: dict = {}
    start = threading.Barrier(clients)

    def client(c: int) -> None:
        start.wait()
        for r in range(rounds):
            transport, inputs, _ = cases[c, r]
            try:
                results[c, r] = predict_via(transport, server, channel, inputs)
            except BaseException as exc:  # noqa: BLE001 - asserted below
                results[c, r] = exc

    run_threads([lambda c=c: client(c) for c in range(clients)])

    for key, (transport, inputs, expected) in cases.items():
        got = results[key]
        assert not isinstance(got, BaseException), (key, transport, got)
        assert_outputs_close(got, expected, f"client {key} over {transport}")

    after = batching_info(server, "demo")
    sent = clients * rounds
    merged = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    assert merged + after["run_alone"] - before["run_alone"] == sent, (before, after)
    assert after["rows"] - before["rows"] == sum(len(c[1]["dense"]) for c in cases.values())
    assert batches >= 1 and merged > batches, f"no batch held more than one request: {after}"
    assert after["padding_rows"] > before["padding_rows"]  # allowed_batch_sizes [8, 32, 64]
    assert after["rejected_queue_full"] == after["expired"] == after["isolated_retries"] == 0
    assert after["batch_rows"]["count"] == after["batches"]
    assert after["queue_wait_seconds"]["count"] == after["requests"]
    assert after["queued_requests"] == after["queued_rows"] == 0


# --- 2. a bad request in a crowd ----------------------------------------------------------------

BAD_REQUESTS = {
    "wrong dtype": lambda: {**demo_inputs(2, seed=5), "dense": demo_inputs(2, seed=5)["dense"].astype(np.float64)},
    "unknown input": lambda: {**demo_inputs(2, seed=6), "bogus": np.zeros((2, 1), np.float32)},
}


@pytest.mark.parametrize("kind", list(BAD_REQUESTS))
def test_bad_request_in_a_crowd_fails_alone(server, channel, reference, kind):
    bad = BAD_REQUESTS[kind]()
    status, message = reference.process(codec.encode_request(bad))
    assert status == 400 and message, message
    message = message.decode()

    good = [demo_inputs(1 + i % 2, seed=200 + i) for i in range(20)]
    expected = [expected_outputs(reference, inputs) for inputs in good]
    results: dict = {}
    start = threading.Barrier(len(good) + 2)

    def send_good(i: int) -> None:
        start.wait()
        try:
            results[i] = (ours_http if i % 2 else ours_grpc)(server if i % 2 else channel, "demo", good[i])
        except BaseException as exc:  # noqa: BLE001
            results[i] = exc

    def send_bad_http() -> None:
        start.wait()
        results["http"] = call(server, "POST", "/api/predict/demo", codec.encode_request(bad))

    def send_bad_grpc() -> None:
        start.wait()
        try:
            results["grpc"] = ours_grpc(channel, "demo", bad)
        except grpc.RpcError as err:
            results["grpc"] = err

    run_threads([lambda i=i: send_good(i) for i in range(len(good))] + [send_bad_http, send_bad_grpc])

    for i, want in enumerate(expected):
        assert not isinstance(results[i], BaseException), (i, results[i])
        assert_outputs_close(results[i], want, f"good request {i}")
    status, _, body = results["http"]
    assert status == 400 and json.loads(body) == {"error": message}, body
    err = results["grpc"]
    assert isinstance(err, grpc.RpcError), err
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == message


# --- 3. deadlines -------------------------------------------------------------------------------

def test_http_deadline_passes_in_the_queue_504(server):
    before = batching_info(server, "slow")
    assert before["settings"]["batch_timeout_micros"] == 1_500_000
    status, body = post_protobuf(server, "slow", toy_x([1.0]), headers={"X-Request-Timeout-Ms": "50"})
    assert status == 504, (status, body)
    doc = json.loads(body)
    assert set(doc) == {"error"} and "deadline" in doc["error"], doc
    after = batching_info(server, "slow")
    assert after["expired"] == before["expired"] + 1
    assert after["batches"] == before["batches"]  # it never ran
    # the same request with room to wait is served
    status, body = post_protobuf(server, "slow", toy_x([1.0]), headers={"X-Request-Timeout-Ms": "30000"})
    assert status == 200 and codec.decode_response(body)["y"].tolist() == toy_y([1.0])


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan"])
def test_bad_timeout_header_is_400_naming_it(server, value):
    status, body = post_protobuf(server, "slow", toy_x([1.0]), headers={"X-Request-Timeout-Ms": value})
    assert status == 400, (status, body)
    assert "X-Request-Timeout-Ms" in json.loads(body)["error"], body


def test_grpc_deadline_is_dropped_by_the_server(server, channel):
    before = batching_info(server, "slow")
    err = grpc_error(_ours_grpc_with_timeout, channel, "slow", toy_x([2.0]), 0.05)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the server dropped it too (once its batch came up, 1.5 s later): counted, never run
    after = wait_for(lambda: (i := batching_info(server, "slow"))["expired"] > before["expired"] and i,
                     timeout=15, what="the server to count the expired gRPC request", interval=0.1)
    assert after["expired"] == before["expired"] + 1
    assert after["batches"] == before["batches"] and after["queued_requests"] == 0


def _ours_grpc_with_timeout(channel, name: str, inputs, timeout: float):
    from processor.proto import predict_pb2, processor_service_pb2_grpc

    stub = processor_service_pb2_grpc.ProcessorServiceStub(channel)
    request = predict_pb2.PredictRequest.FromString(codec.encode_request(inputs))
    return stub.Predict(request, metadata=[("model-name", name)], timeout=timeout)


# --- 4. a full queue ----------------------------------------------------------------------------

def test_full_queue_refuses_at_once_503(server, channel):
    before = batching_info(server, "tiny")
    assert before["settings"]["max_enqueued_batches"] == 1 and before["settings"]["max_batch_size"] == 4
    first: dict = {}

    def send_first() -> None:
        first["result"] = post_protobuf(server, "tiny", toy_x([1.0, 2.0, 3.0]))

    waiting = threading.Thread(target=send_first)
    waiting.start()
    try:
        wait_for(lambda: batching_info(server, "tiny")["queued_requests"] == 1, timeout=10,
                 what="the first request to be queued")
        status, body = post_protobuf(server, "tiny", toy_x([4.0, 5.0, 6.0]))
        first_waited_http = "result" not in first
        err = grpc_error(ours_grpc, channel, "tiny", toy_x([7.0, 8.0, 9.0]))
        first_waited_grpc = "result" not in first
    finally:
        waiting.join(30)
    assert status == 503 and "queue is full" in json.loads(body)["error"], (status, body)
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "queue is full" in err.details(), err
    # both were refused while the first still waited for its batch
    assert first_waited_http and first_waited_grpc
    status, body = first["result"]
    assert status == 200 and codec.decode_response(body)["y"].tolist() == toy_y([1.0, 2.0, 3.0]), body
    after = batching_info(server, "tiny")
    assert after["rejected_queue_full"] == before["rejected_queue_full"] + 2
    assert after["batches"] == before["batches"] + 1 and after["requests"] == before["requests"] + 1


# --- 5. /metrics --------------------------------------------------------------------------------

def test_metrics_expose_the_batching_families(server, channel):
    from prometheus_client.parser import text_string_to_metric_families

    inputs = [demo_inputs(1 + i % 3, seed=300 + i) for i in range(8)]
    run_threads([lambda x=x: ours_http(server, "demo", x) for x in inputs])

    infos = {name: batching_info(server, name) for name in ("demo", "slow", "tiny")}
    status, _, data = call(server, "GET", "/metrics")
    assert status == 200
    text = data.decode()
    assert 'sp_batch_size_bucket{le="+Inf",model="demo"}' in text or \
           'sp_batch_size_bucket{model="demo",le="+Inf"}' in text, text[-3000:]
    samples: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("sp_batch_"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def value(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        assert key in samples, (key, sorted(k for k in samples if k[0] == name))
        return samples[key]

    for model, info in infos.items():
        assert value("sp_batch_size_count", model=model) == info["batches"]
        assert value("sp_batch_size_sum", model=model) == pytest.approx(info["batch_rows"]["sum"])
        assert value("sp_batch_queue_wait_seconds_count", model=model) == info["queue_wait_seconds"]["count"]
        for bound, count in info["batch_rows"]["buckets"]:
            infinite = bound is None or isinstance(bound, str) or bound == float("inf")
            le = "+Inf" if infinite else repr(float(bound))
            assert value("sp_batch_size_bucket", model=model, le=le) == count
        assert value("sp_batch_queue_depth", model=model) == info["queued_requests"] == 0
        assert value("sp_batch_queue_rows", model=model) == info["queued_rows"] == 0
        for event in ("run_alone", "isolated_retries", "rejected_queue_full", "expired"):
            assert value("sp_batch_events_total", model=model, event=event) == info[event], (model, event)
    demo = infos["demo"]
    assert demo["batches"] >= 1 and demo["queue_wait_seconds"]["count"] == demo["requests"] >= 8
    assert value("sp_batch_size_bucket", model="demo", le="+Inf") == demo["batches"]


# --- 6. SIGTERM drains the queue ----------------------------------------------------------------

@pytest.mark.timeout(180)
@pytest.mark.parametrize("drain_backend", BACKENDS)
def test_sigterm_answers_every_queued_request_and_exits_0(drain_backend, toy_model, tmp_path):
    from tools.server_process import ServerProcess

    deployment = {"models": [{"name": "toy", "model_config": backend_config(toy_model, drain_backend, batching=batching(
        max_batch_size=64, batch_timeout_micros=4_000_000, allowed_batch_sizes=[]))}],
        "drain_timeout_seconds": 20, "access_log": False}
    server = ServerProcess(deployment, tmp_path).start(timeout=180)
    count = 6
    values = [[float(i), float(i) + 0.5] for i in range(count)]
    results: dict = {}
    try:
        assert server.wait_models(60) == {"toy": "ready"}, server.log()

        def send(i: int) -> None:
            try:
                results[i] = post_protobuf(server, "toy", toy_x(values[i]))
            except BaseException as exc:  # noqa: BLE001
                results[i] = exc

        threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        wait_for(lambda: batching_info(server, "toy")["queued_requests"] == count, timeout=3.5,
                 what=f"{count} requests to be queued")
        assert not results, results  # all still waiting for their batch (4 s after the first came)
        server.terminate()
        for t in threads:
            t.join(60)
        rc = server.proc.wait(30)
    finally:
        server.kill()
    for i in range(count):
        assert not isinstance(results[i], BaseException), results[i]
        status, body = results[i]
        assert status == 200, body
        assert codec.decode_response(body)["y"].tolist() == toy_y(values[i])
    assert rc == 0, server.log()
    log = server.log()
    assert "SIGTERM received: draining" in log
    drained = re.search(r"drained (\d+) in-flight request", log)
    assert drained and int(drained.group(1)) >= count, log[-3000:]
