"""Large requests against a real server (``python -m server`` on 127.0.0.1 ports; the demo CTR
model, two lanes, the default ``max_execution_batch_size``, and a copy with ``max_request_rows``):

* The row limit: 413 naming ``max_request_rows`` over HTTP (TF Serving REST and our protobuf
  endpoint), RESOURCE_EXHAUSTED over TF Serving's gRPC Predict; the server answers after.
* Memory (``slow``): a 45 MB / 220,000-row TF Serving JSON request is answered 200, split, with
  the predictions of its rows asked alone, and the server's peak RSS grows at most 5 x the body
  (it grew 39 x before splitting, issue 26).
"""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import model_config
from processor import codec
from sp_checks import assert_outputs_close
from test_server_json_limits import MB, demo_row, post, reset_peak, status_kb

LIMIT = 100


@pytest.fixture(scope="module")
def server(ctr_model_small, tmp_path_factory):
    from tools.server_process import ServerProcess

    deployment = {
        "models": [{"name": "demo", "model_config": model_config(ctr_model_small, session_num=2)},
                   {"name": "limited", "model_config": model_config(ctr_model_small, max_request_rows=LIMIT)}],
        "access_log": False, "body_read_timeout_seconds": 120,
    }
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("splitting")).start(timeout=180)
    assert proc.wait_models(60) == {"demo": "ready", "limited": "ready"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


def rows_body(rows: list[bytes], reps: int) -> bytes:
    return b'{"instances": [' + b",".join(rows * reps) + b"]}"


def distinct_rows(k: int) -> list[bytes]:
    return [demo_row(ids=", ".join(str((i * 7 + j) % 500) for j in range(20))) for i in range(k)]


def model_info(server, name: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/api/models/{name}", timeout=30) as resp:
        return json.loads(resp.read())


def test_row_limit_is_413_over_http_and_resource_exhausted_over_grpc(server):
    from demo.synthetic_data import synthetic_batch
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    status, _, data = post(server, rows_body(distinct_rows(1), LIMIT + 1), "/v1/models/limited:predict")
    assert status == 413, data
    assert f"max_request_rows ({LIMIT})" in json.loads(data)["error"]
    status, _, data = post(server, codec.encode_request(synthetic_batch(LIMIT + 1, 1)), "/api/predict/limited")
    assert status == 413 and b"max_request_rows" in data, data

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "limited"
    for key, array in synthetic_batch(LIMIT + 1, 2).items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(array))
    with grpc.insecure_channel(server.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as err:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"max_request_rows ({LIMIT})" in err.value.details()

    status, _, data = post(server, rows_body(distinct_rows(1), LIMIT), "/v1/models/limited:predict")
    assert status == 200 and len(json.loads(data)["predictions"]) == LIMIT


@pytest.mark.slow
def test_45mb_request_is_split_with_peak_memory_within_5x_body(server):
    k = 100
    block = distinct_rows(k)
    reps = 220_000 // k
    body = rows_body(block, reps)
    status, _, data = post(server, rows_body(block, 1), "/v1/models/demo:predict")
    assert status == 200, data
    want = json.loads(data)["predictions"]
    post(server, rows_body(block, 100), "/v1/models/demo:predict")  # thread pools, caches warm
    pid = server.proc.pid
    before_split = model_info(server, "demo")["session_group"]["splitting"]
    before = reset_peak(pid)
    started = time.perf_counter()
    status, _, data = post(server, body, "/v1/models/demo:predict")
    seconds = time.perf_counter() - started
    growth = status_kb(pid)["VmHWM"] - before
    print(f"\n{len(body) / MB:.1f} MB body, {reps * k} rows: {seconds:.1f} s, peak RSS growth "
          f"{growth / MB:.0f} MB = {growth / len(body):.2f} x body")
    assert status == 200, data[:1000]
    got = json.loads(data)["predictions"]
    assert len(got) == reps * k
    for key in want[0]:
        whole = np.array([row[key] for row in want], np.float32)
        split = np.array([row[key] for row in got], np.float32).reshape((reps, k) + whole.shape[1:])
        assert_outputs_close({key: split}, {key: np.broadcast_to(whole, split.shape)}, key)
    after_split = model_info(server, "demo")["session_group"]["splitting"]
    assert after_split["split_requests"] == before_split["split_requests"] + 1
    assert growth <= 5 * len(body), f"peak RSS growth {growth / len(body):.2f} x the body"
