"""Prediction logging in process, on the real toy model (y = 0.5x + 2) through the C ABI's
Processor and the DataPlane: the hot path, batched requests (process_many, merged), array
calls, sampling within binomial bounds, a full queue, and a sink that fails under a serving
model. Records are read back with TensorFlow's reader and TF Serving's protos."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest

from conftest import model_config
from processor import codec, native
from processor.request import PredictCall

tf = pytest.importorskip("tensorflow")
prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")


def records(directory) -> list:
    files = sorted(str(p) for p in directory.glob("*.tfrecord"))
    return [prediction_log_pb2.PredictionLog.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(files)]


def x_of(entry) -> np.ndarray:
    return tf.make_ndarray(entry.predict_log.request.inputs["x"])


def request(*xs: float) -> bytes:
    return codec.encode_request({"x": np.array([[x] for x in xs], np.float32)})


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_hot_path_batched_and_array_calls_are_logged(toy_model, make_processor, tmp_path, backend):
    logs = tmp_path / "logs"
    processor = make_processor(model_config(
        toy_model, backend=backend, batching={"max_batch_size": 8, "batch_timeout_micros": 0},
        logging_config={"sampling_rate": 1.0, "path": str(logs)}), "toy")
    view = memoryview(bytearray(request(1.0, 2.0))).toreadonly()  # as the C ABI hands it over
    assert processor.process(view)[0] == 200
    assert [status for status, _ in processor.process_many([request(3.0), request(4.0), b""])] == [200] * 3
    result = processor.dataplane.predict(PredictCall("toy", lambda signature: {"x": np.array([[5.0]], np.float32)}))
    np.testing.assert_allclose(result.outputs["y"], [[4.5]], rtol=1e-5, atol=1e-6)
    assert processor.process(b"")[0] == 200  # the introspection ping is not a prediction
    assert processor.model.prediction_log.flush()

    got = records(logs)
    assert [x_of(e).ravel().tolist() for e in got] == [[1.0, 2.0], [3.0], [4.0], [5.0]]
    for entry in got:
        x = x_of(entry)
        y = tf.make_ndarray(entry.predict_log.response.outputs["y"])
        np.testing.assert_allclose(y, 0.5 * x + 2, rtol=1e-5, atol=1e-6)
        assert entry.log_metadata.model_spec.name == "toy" and entry.log_metadata.model_spec.version.value == 1
    assert processor.model_info()["prediction_log"]["written"] == 4


def test_sampling_rate_is_honoured_within_binomial_bounds(toy_model, make_processor, tmp_path):
    logs = tmp_path / "logs"
    rate, n = 0.25, 2000
    processor = make_processor(model_config(toy_model, logging_config={
        "sampling_rate": rate, "path": str(logs), "format": "jsonl"}), "toy")
    body = request(1.0)
    assert all(processor.process(body)[0] == 200 for _ in range(n))
    assert processor.model.prediction_log.flush()
    logged = sum(len(p.read_text().splitlines()) for p in logs.glob("*.jsonl"))
    sigma = math.sqrt(n * rate * (1 - rate))
    assert abs(logged - n * rate) < 6 * sigma, logged  # fails by chance about once in 10^9 runs
    info = processor.model_info()["prediction_log"]
    assert info["written"] == logged and info["dropped_queue_full"] == 0


def test_full_queue_drops_are_counted_and_requests_unaffected(toy_model, make_processor, tmp_path):
    processor = make_processor(model_config(toy_model, logging_config={
        "sampling_rate": 1.0, "path": str(tmp_path / "logs"), "queue_size": 1}), "toy")
    n = 2000  # back to back, far faster than a writer that looks at its queue every 50 ms
    body = request(1.0)
    answers = {processor.process(body) for _ in range(n)}
    assert len(answers) == 1 and next(iter(answers))[0] == 200
    assert processor.model.prediction_log.flush()
    info = processor.model_info()["prediction_log"]
    assert info["written"] + info["dropped_queue_full"] == n and info["dropped_queue_full"] > 0, info
    assert len(records(tmp_path / "logs")) == info["written"]


def test_a_failing_sink_leaves_serving_alone_and_is_reported(toy_model, make_processor, tmp_path):
    logs = tmp_path / "logs"
    processor = make_processor(model_config(toy_model, logging_config={"sampling_rate": 1.0, "path": str(logs)}),
                               "toy")
    shutil.rmtree(logs)
    logs.write_text("")  # the directory is gone: a file stands in its place (ENOTDIR on open)
    for x in range(5):
        status, body = processor.process(request(float(x)))
        assert status == 200
        np.testing.assert_allclose(codec.decode_response(body)["y"], [[0.5 * x + 2]], rtol=1e-5, atol=1e-6)
    assert processor.model.prediction_log.flush()
    info = processor.model_info()["prediction_log"]
    assert info["written"] == 0 and info["failed"] == 5 and info["write_errors"] >= 1
    assert "Not a directory" in info["last_error"] or "exists" in info["last_error"], info["last_error"]
    os.unlink(logs)  # the disk is back: logging resumes
    assert processor.process(request(9.0))[0] == 200
    assert processor.model.prediction_log.flush()
    assert [x_of(e).ravel().tolist() for e in records(logs)] == [[9.0]]


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_calls_an_event_loop_runs_in_place_are_sampled_once(toy_model, make_processor, tmp_path, backend):
    """DataPlane.submit (the HTTP and gRPC edges' door) samples a logged model's call it runs in
    place; one its plan sends to a thread (the TensorFlow group does not serve natively) is
    sampled there: either way each call is logged at the sampling rate, with what was sent."""
    from processor.dataplane import Deferred

    logs = tmp_path / "logs"
    rate, n = 0.25, 2000
    processor = make_processor(model_config(toy_model, backend=backend, logging_config={
        "sampling_rate": rate, "path": str(logs)}), "toy")
    dataplane = processor.dataplane
    taken = 0
    for i in range(n):
        call = PredictCall("toy", request(float(i)))
        result = dataplane.submit(call, 8192)
        if isinstance(result, Deferred):
            result = result.run()
        else:
            taken += 1
        np.testing.assert_allclose(codec.decode_response(result.outputs)["y"], [[0.5 * i + 2]], rtol=1e-5)
    in_place = dataplane.plan("toy").native
    assert in_place == (backend == "onnxruntime" and native.MODULE is not None)
    assert taken == (n if in_place else 0)
    assert processor.model.prediction_log.flush()
    got = records(logs)
    sigma = math.sqrt(n * rate * (1 - rate))
    assert abs(len(got) - n * rate) < 6 * sigma, len(got)  # fails by chance about once in 10^9 runs
    for entry in got:
        x = x_of(entry)
        np.testing.assert_allclose(tf.make_ndarray(entry.predict_log.response.outputs["y"]), 0.5 * x + 2,
                                   rtol=1e-5, atol=1e-6)
