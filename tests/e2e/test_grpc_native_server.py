"""The native gRPC server (issue 50, ``grpc_server: "native"``) against the Python one, over real
sockets: two ``python -m server`` processes with the same deployment (the DLRM-like ``.onnx``
model, no TensorFlow needed) but the ``grpc_server`` key.

* our ``ProcessorService/Predict`` on a batching model, with no deadline, runs on the native
  direct path (the server reports how many calls it answered natively when it stops) and answers
  what the Python server answers, byte for byte, with the same ``x-model-version``; concurrent
  calls are merged into batches; SIGTERM lets the calls waiting for their batch finish;
* TF Serving's ``Predict`` (its official stubs; raw and typed tensors) and KServe v2
  ``ModelInfer`` (tritonclient) on that model take the direct path too (the server's
  ``sp_grpc_native_calls{path="direct"}`` counts them) and answer what the Python server answers;
  ``model-name`` wins over ``x-model-name`` on both servers;
* through the bridge: our Predict on a model without batching, TF Serving's and v2's calls to it
  or naming a version or another signature, the health service (``Check`` and the streaming
  ``Watch``);
* errors as the Python server gives them: an unknown model's NOT_FOUND with the status table's
  message, a passed deadline, a message over ``max_request_bytes``. (Fuzzed messages and frames
  against both: tests/e2e/test_grpc_native_fuzz.py.)
"""

from __future__ import annotations

import re
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from processor import codec
from processor.errors import STATUS_TABLE
from sp_checks import set_model_spec

pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built (libgrpc++-dev missing; "
                                                       "scripts/build_native.sh says so)")

PREDICT = "/tensorflow.eas.ProcessorService/Predict"
LIMIT = 1 << 16  # max_request_bytes
SERVERS = ("python", "native")
TABLE_CODES = {grpc.StatusCode[row.grpc] for row in STATUS_TABLE.values()}


def batching(**overrides) -> dict:
    return {"max_batch_size": 64, "batch_timeout_micros": 2000, "num_batch_threads": 1, "max_enqueued_batches": 100,
            **overrides}


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    from demo import dlrm_onnx

    path = tmp_path_factory.mktemp("dlrm") / "model.onnx"
    dlrm_onnx.build(path, rows=1000, dim=8)
    return path.parent


def deployment(dlrm, server: str) -> dict:
    config = {"savedmodel_dir": str(dlrm), "backend": "onnxruntime", "session_num": 1,
              "use_per_session_threads": True, "intra_op_parallelism_threads": 1}
    return {
        "models": [
            {"name": "b", "model_config": {**config, "batching": batching()}},
            {"name": "p", "model_config": config},
            # a batch waits 1.5 s for company: the deadline tests
            {"name": "slow", "model_config": {**config, "batching": batching(max_batch_size=1024,
                                                                               batch_timeout_micros=1_500_000)}},
        ],
        "grpc_server": server, "max_request_bytes": LIMIT, "access_log": False, "drain_timeout_seconds": 5,
        "max_header_bytes": 4096,
    }


@pytest.fixture(scope="module")
def servers(dlrm, tmp_path_factory):
    from tools.server_process import ServerProcess

    started = {}
    try:
        for name in SERVERS:
            proc = ServerProcess(deployment(dlrm, name), tmp_path_factory.mktemp(f"grpc-{name}"))
            started[name] = proc.start(timeout=180)
            assert proc.wait_models(60) == {"b": "ready", "p": "ready", "slow": "ready"}, proc.log()
        yield started
    finally:
        for name, proc in started.items():
            code = proc.stop(timeout=30)
            assert code == 0, proc.log()[-3000:]
    log = started["native"].log()
    # the stop's report: calls answered on the direct path (the Predicts to "b") and bridged
    found = re.search(r"(\d+) calls answered natively", log)
    assert found and int(found.group(1)) >= 1, log[-3000:]


@pytest.fixture(scope="module")
def channels(servers):
    made = {name: grpc.insecure_channel(proc.grpc_target) for name, proc in servers.items()}
    yield made
    for channel in made.values():
        channel.close()


def feeds(batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    from demo import dlrm_onnx

    return dlrm_onnx.inputs(batch, seed=seed)


def rpc_error(fn, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kw)
    return info.value


# --- our Predict --------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 8])
def test_predict_on_the_direct_path_equals_the_python_server(channels, batch):
    body = codec.encode_request(feeds(batch, seed=batch))
    answers = {}
    for name, channel in channels.items():
        raw, call = channel.unary_unary(PREDICT).with_call(body, metadata=[("model-name", "b")])  # no deadline
        initial, trailing = dict(call.initial_metadata()), dict(call.trailing_metadata())
        assert trailing["x-request-id"], trailing
        answers[name] = (raw, initial["x-model-version"])
    assert answers["native"] == answers["python"]
    assert codec.decode_response(answers["native"][0])["prob"].shape == (batch, 1)
    # with a deadline the call goes through Python (which hands the deadline to the queue): the same
    with_deadline = channels["native"].unary_unary(PREDICT)(body, metadata=[("model-name", "b")], timeout=30)
    assert with_deadline == answers["native"][0]


def test_predict_echoes_a_sane_request_id_and_names_a_fresh_one_otherwise(channels):
    body = codec.encode_request(feeds(1))
    predict = channels["native"].unary_unary(PREDICT)
    _, call = predict.with_call(body, metadata=[("model-name", "b"), ("x-request-id", "abc-123")])
    assert dict(call.trailing_metadata())["x-request-id"] == "abc-123"
    _, call = predict.with_call(body, metadata=[("model-name", "b"), ("x-request-id", "bad id!")])
    rid = dict(call.trailing_metadata())["x-request-id"]
    assert rid != "bad id!" and len(rid) == 16 and int(rid, 16) >= 0


def test_concurrent_predicts_are_merged_into_batches(servers, channels):
    inputs = [feeds(1, seed=s) for s in range(64)]
    bodies = [codec.encode_request(x) for x in inputs]
    expected = [channels["python"].unary_unary(PREDICT)(b, metadata=[("model-name", "p")], timeout=30) for b in bodies]
    before = servers["native"].get_json("/api/models/b")["batching"]
    predict = channels["native"].unary_unary(PREDICT)
    got: dict[int, bytes] = {}

    def client(k: int) -> None:
        for i in range(k, len(bodies), 16):
            got[i] = predict(bodies[i], metadata=[("model-name", "b")])  # no deadline: the direct path
    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, raw in got.items():
        np.testing.assert_allclose(codec.decode_response(raw)["prob"], codec.decode_response(expected[i])["prob"],
                                   rtol=1e-5, atol=1e-6)
    assert len(got) == len(bodies)
    after = servers["native"].get_json("/api/models/b")["batching"]
    assert after["requests"] - before["requests"] >= len(bodies), (before, after)
    assert after["batches"] - before["batches"] < len(bodies), (before, after)


def test_predict_without_batching_and_the_ping_go_through_the_bridge(channels):
    body = codec.encode_request(feeds(3))
    raw = {name: ch.unary_unary(PREDICT).with_call(body, metadata=[("model-name", "p")], timeout=30)
           for name, ch in channels.items()}
    assert raw["native"][0] == raw["python"][0]
    assert dict(raw["native"][1].initial_metadata())["x-model-version"] == \
        dict(raw["python"][1].initial_metadata())["x-model-version"]
    # an empty message: DeepRec's introspection ping (the signature JSON), from Python
    pings = {name: ch.unary_unary(PREDICT)(b"", metadata=[("model-name", "b")], timeout=30)
             for name, ch in channels.items()}
    assert pings["native"] == pings["python"] and pings["native"].startswith(b"{")


# --- the bridge: other protocols ------------------------------------------------------------------

def direct_calls(proc) -> float:
    """The native server's calls answered on the direct path so far (its metrics, folded every
    half second)."""
    import urllib.request

    with urllib.request.urlopen(proc.http + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith('sp_grpc_native_calls_total{path="direct"}'):
                return float(line.split()[-1])
    return 0.0


def wait_direct(proc, at_least: float) -> float:
    deadline = time.monotonic() + 10
    while (n := direct_calls(proc)) < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def tfs_request(model: str, batch: int, content: bool = True, **spec):
    from tensorflow_serving.apis import predict_pb2

    from server.tfserving.tensor_proto import from_numpy

    request = predict_pb2.PredictRequest()
    set_model_spec(request.model_spec, model, **spec)
    for key, array in feeds(batch, seed=batch).items():
        from_numpy(array, request.inputs[key], tensor_content=content)
    return request


@pytest.mark.parametrize("content", [True, False], ids=["tensor_content", "typed"])
def test_tf_serving_predict_on_the_direct_path_answers_as_the_python_server(servers, channels, content):
    pytest.importorskip("tensorflow_serving", reason="tensorflow-serving-api is installed by scripts/setup.sh")
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from server.tfserving.tensor_proto import to_numpy

    before = direct_calls(servers["native"])
    answers = {}
    for name, channel in channels.items():
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for model in ("b", "p"):  # b: the direct path (no deadline, and with one); p: the bridge
            for timeout in (None, 30):
                response, call = stub.Predict.with_call(tfs_request(model, 4, content), timeout=timeout)
                assert dict(call.trailing_metadata())["x-request-id"]
                answers[name, model, timeout] = response
    for key, response in answers.items():
        reference = answers[("python", *key[1:])]
        assert response.model_spec == reference.model_spec, key
        assert set(response.outputs) == set(reference.outputs) == {"prob"}
        got, want = response.outputs["prob"], reference.outputs["prob"]
        assert (got.dtype, got.tensor_shape) == (want.dtype, want.tensor_shape)
        assert not got.tensor_content and not want.tensor_content  # typed: the model's default
        np.testing.assert_allclose(to_numpy("prob", got), to_numpy("prob", want), rtol=1e-5, atol=1e-6)
    assert wait_direct(servers["native"], before + 2) >= before + 2  # b's two calls, natively
    # a version, a signature other than the default: Python resolves them, as it answers them
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channels["native"])
    version = answers["native", "b", None].model_spec.version.value
    assert stub.Predict(tfs_request("b", 2, version=version), timeout=30).model_spec.version.value == version
    for name, channel in channels.items():
        err = rpc_error(prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict,
                        tfs_request("b", 2, signature_name="nope"), timeout=30)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, err)


def test_kserve_v2_model_infer_on_the_direct_path_answers_as_the_python_server(servers):
    tgrpc = pytest.importorskip("tritonclient.grpc", reason="tritonclient is a dev dependency (scripts/setup.sh)")
    before = direct_calls(servers["native"])
    answers = {}
    for name, proc in servers.items():
        client = tgrpc.InferenceServerClient(proc.grpc_target)
        assert client.is_server_live() and client.is_model_ready("b")
        inputs = []
        for key, array in feeds(4).items():
            tensor = tgrpc.InferInput(key, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        for model in ("b", "p"):
            result = client.infer(model, inputs, request_id="r-7", outputs=[tgrpc.InferRequestedOutput("prob")])
            response = result.get_response()
            answers[name, model] = (response.model_name, response.model_version, response.id,
                                    [(o.name, o.datatype, list(o.shape)) for o in response.outputs],
                                    result.as_numpy("prob"))
        client.close()
    for (name, model), answer in answers.items():
        reference = answers["python", model]
        assert answer[:4] == reference[:4] and answer[0] == model and answer[2] == "r-7", (name, model)
        np.testing.assert_allclose(answer[4], reference[4], rtol=1e-5, atol=1e-6)
    assert wait_direct(servers["native"], before + 1) >= before + 1


def test_model_name_wins_over_x_model_name_on_both_servers(channels):
    body = codec.encode_request(feeds(1))
    for name, channel in channels.items():
        predict = channel.unary_unary(PREDICT)
        assert predict(body, metadata=[("x-model-name", "nope"), ("model-name", "b")], timeout=30), name
        err = rpc_error(predict, body, metadata=[("x-model-name", "b"), ("model-name", "nope")], timeout=30)
        assert err.code() == grpc.StatusCode.NOT_FOUND, (name, err)
        assert predict(body, metadata=[("x-model-name", "b")])  # alone, it names the model


def test_health_check_and_watch_through_the_bridge(channels):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    for channel in channels.values():
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "b", "tensorflow.eas.ProcessorService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        err = rpc_error(stub.Check, health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert err.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="b"), timeout=10)  # server streaming
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


# --- errors as the Python server gives them -------------------------------------------------------

def test_unknown_model_is_not_found_with_the_tables_message(channels):
    body = codec.encode_request(feeds(1))
    details = {}
    for name, channel in channels.items():
        err = rpc_error(channel.unary_unary(PREDICT), body, metadata=[("model-name", "nope")], timeout=30)
        assert err.code() == grpc.StatusCode.NOT_FOUND
        details[name] = err.details()
    assert details["native"] == details["python"] and "unknown model 'nope'" in details["native"]


@pytest.mark.parametrize("path", [PREDICT, "/tensorflow.serving.PredictionService/Predict"])
def test_a_passed_deadline(channels, path):
    """The slow model's batch waits 1.5 s: a call whose deadline passes first (with a deadline, our
    Predict goes through the bridge too) is DEADLINE_EXCEEDED on both servers, and both serve the
    next call."""
    from server.tfserving.messages import messages
    from server.tfserving.tensor_proto import from_numpy

    if path == PREDICT:
        body = codec.encode_request(feeds(1))
    else:
        request = messages().PredictRequest()
        request.model_spec.name = "slow"
        for key, array in feeds(1).items():
            from_numpy(array, request.inputs[key], tensor_content=True)
        body = request.SerializeToString()
    for channel in channels.values():
        err = rpc_error(channel.unary_unary(path), body, metadata=[("model-name", "slow")], timeout=0.3)
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert channel.unary_unary(PREDICT)(codec.encode_request(feeds(1)), metadata=[("model-name", "b")],
                                            timeout=30)


def test_metadata_over_max_header_bytes_is_refused(channels):
    body = codec.encode_request(feeds(1))
    codes = {}
    for name, channel in channels.items():
        err = rpc_error(channel.unary_unary(PREDICT), body, metadata=[("model-name", "b"), ("x-big", "x" * 8000)],
                        timeout=30)
        codes[name] = err.code()
    assert codes["native"] == codes["python"], codes


def test_the_unix_socket_and_the_concurrent_rpc_limit(dlrm, tmp_path):
    """grpc_socket_path: the native server listens there too (TF Serving's --grpc_socket_path);
    beyond grpc_max_concurrent_rpcs calls in progress, a call is RESOURCE_EXHAUSTED (grpcio's words)."""
    from tools.server_process import ServerProcess

    socket_path = tmp_path / "grpc.sock"
    stale = socket.socket(socket.AF_UNIX)  # a socket file left by a server that died is replaced
    stale.bind(str(socket_path))
    stale.close()
    dep = {**deployment(dlrm, "native"), "grpc_socket_path": str(socket_path), "grpc_max_concurrent_rpcs": 1}
    with ServerProcess(dep, tmp_path).start(180) as proc:
        body = codec.encode_request(feeds(2))
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            over_socket = channel.unary_unary(PREDICT)(body, metadata=[("model-name", "b")])
        with grpc.insecure_channel(proc.grpc_target) as channel:
            predict = channel.unary_unary(PREDICT)
            assert admitted(lambda: predict(body, metadata=[("model-name", "b")])) == over_socket
            deadline = time.monotonic() + 10
            slow = predict.future(body, metadata=[("model-name", "slow")])  # in progress for 1.5 s
            while proc.get_json("/api/models/slow")["batching"]["queued_requests"] < 1:
                assert time.monotonic() < deadline, "the slow call did not arrive"
                if slow.done():  # refused: the previous call had not quite ended in the server
                    slow = predict.future(body, metadata=[("model-name", "slow")])
                time.sleep(0.02)
            err = rpc_error(predict, body, metadata=[("model-name", "b")], timeout=10)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Concurrent RPC limit" in err.details()
            assert slow.result()
            assert admitted(lambda: predict(body, metadata=[("model-name", "b")])) == over_socket


def admitted(call):
    """``call()``, again while it is RESOURCE_EXHAUSTED: a call answered a moment ago may still be
    ending in the server, counted in progress."""
    for _ in range(100):
        try:
            return call()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            time.sleep(0.02)
    return call()


def test_a_message_over_max_request_bytes_is_refused(channels):
    body = codec.encode_request(feeds(400))  # ~100 KB
    assert len(body) > LIMIT
    for channel in channels.values():
        err = rpc_error(channel.unary_unary(PREDICT), body, metadata=[("model-name", "b")], timeout=30)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_sigterm_drains_the_direct_paths_calls(dlrm, tmp_path):
    """Calls waiting on the direct path for their batch (the slow model's 1.5 s) when SIGTERM
    comes are answered; a call that comes during the drain is UNAVAILABLE; exit status 0."""
    from tools.server_process import ServerProcess

    proc = ServerProcess(deployment(dlrm, "native"), tmp_path).start(timeout=180)
    answers: list = []
    try:
        channel = grpc.insecure_channel(proc.grpc_target)
        body = codec.encode_request(feeds(1))
        futures = [channel.unary_unary(PREDICT).future(body, metadata=[("model-name", "slow")])  # direct path
                   for _ in range(8)]
        time.sleep(0.5)
        proc.terminate()
        time.sleep(0.2)
        late = rpc_error(channel.unary_unary(PREDICT), body, metadata=[("model-name", "b")], timeout=10)
        assert late.code() == grpc.StatusCode.UNAVAILABLE, late
        answers = [f.result() for f in futures]
        channel.close()
        proc.proc.wait(30)  # the drain ends by itself
    finally:
        code = proc.stop(timeout=30)
    assert code == 0, proc.log()[-3000:]
    assert len(answers) == 8 and all(codec.decode_response(a)["prob"].shape == (1, 1) for a in answers)
    assert re.search(r"[1-9]\d* calls answered natively", proc.log()), proc.log()[-3000:]
