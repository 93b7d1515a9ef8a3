"""processor.prediction_log.transcode: served wire calls renumbered into PredictionLog records.

The native twin (native/src/predict_log.cc) against the Python reference, byte for byte, on
every dtype the transcoder copies and on what it refuses; and the records it makes, read back
with TensorFlow and TF Serving's protos, against the records the decoding path writes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from processor import codec, native
from processor.dtypes import dtype_of_array
from processor.prediction_log import formats, transcode
from processor.prediction_log.proto import PredictionLog
from processor.prediction_log.record import Pending, resolve
from processor.request import PredictResult
from processor.signature import Signature, TensorSpec

tf = pytest.importorskip("tensorflow")
prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")

ARRAYS = {
    "f32": np.array([[1.5, -2.25, np.inf]], np.float32),
    "f64": np.array([0.1, -1e300], np.float64),
    "i32": np.array([[-(2**31), 2**31 - 1]], np.int32),
    "i64": np.array([[-1, 2**62, 0]], np.int64),
    "i16": np.array([-300, 300], np.int16),
    "i8": np.array([-128, 127], np.int8),
    "u8": np.array([0, 255], np.uint8),
    "u16": np.array([0, 65535], np.uint16),
    "flag": np.array([True, False, True]),
    "tokens": np.array([[b"a", b"", b"\xff\xfe not utf-8"]], dtype=object),
    "scalar": np.array(3.0, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}


def signature(arrays: dict) -> Signature:
    """Inputs named ``<alias>:0`` in the graph, taken by either name."""
    inputs = {k: TensorSpec(k, f"{k}:0", dtype_of_array(np.asarray(a)), None) for k, a in arrays.items()}
    outputs = {"y": TensorSpec("y", "y:0", 1, None)}
    return Signature("serving_default", inputs, outputs)


def tail_both(request: bytes, response: bytes, sig: Signature) -> bytes | None:
    """The native tail, after checking it equals the reference's (None for both when refused)."""
    try:
        reference = transcode.predict_log_tail_reference(request, response, sig.input_aliases)
    except transcode.NotTranscodable:
        reference = None
    if native.MODULE is not None:
        assert native.MODULE.predict_log_tail(request, response, sig.input_aliases) == reference
    return reference


def served(request: bytes, outputs: dict, sig: Signature) -> Pending:
    pending = Pending("m", time.time_ns(), "rid-7", request, None)
    pending.result = PredictResult(codec.encode_response(outputs), _Version(), sig)
    return pending


class _Version:
    full_step = 42


def parsed(record: bytes):
    """TF Serving's PredictionLog of one TFRecord."""
    return prediction_log_pb2.PredictionLog.FromString(record[12:-4])


def ours(record: bytes):
    """Our PredictionLog (with the metadata fields TF Serving's proto lacks) of one TFRecord."""
    return PredictionLog.FromString(record[12:-4])


def test_every_copied_dtype_equals_the_decoding_path_read_back_with_tensorflow():
    sig = signature(ARRAYS)
    named = {f"{k}:0" if i % 2 else k: v for i, (k, v) in enumerate(ARRAYS.items())}  # aliases and tensor names
    request = codec.encode_request(named, output_filter=["y"])
    outputs = {"y": np.array([[0.25], [0.5]], np.float32), "ids": np.array([7, 8], np.int64)}
    pending = served(request, outputs, sig)
    assert tail_both(request, pending.result.outputs, sig) is not None

    fast = parsed(formats.prediction_log_pending(pending, 0.5))
    slow = parsed(formats.prediction_log(resolve(pending), 0.5))
    assert set(fast.predict_log.request.inputs) == set(ARRAYS)  # keyed by alias, as decoded
    for key, array in ARRAYS.items():
        for entry in (fast, slow):
            got = tf.make_ndarray(entry.predict_log.request.inputs[key])
            assert got.shape == array.shape and (got.dtype == array.dtype or array.dtype == object)
            np.testing.assert_array_equal(got, array)
    for key, array in outputs.items():
        np.testing.assert_array_equal(tf.make_ndarray(fast.predict_log.response.outputs[key]), array)
    assert list(fast.predict_log.request.output_filter) == ["y"]
    for entry in (fast, slow):
        assert entry.log_metadata.model_spec.version.value == 42
        assert entry.predict_log.response.model_spec == entry.log_metadata.model_spec
        assert entry.predict_log.request.model_spec == entry.log_metadata.model_spec
    assert fast.log_metadata == slow.log_metadata
    assert ours(formats.prediction_log_pending(pending, 0.5)).log_metadata.request_id == "rid-7"


@pytest.mark.parametrize("case", ["complex", "half", "unknown key", "unpacked floats", "fixed32 field",
                                  "truncated", "field zero", "values in the wrong field"])
def test_what_only_the_decoding_path_writes_is_refused_by_both_and_still_logged(case):
    arrays = {"x": np.array([[1.0, 2.0]], np.float32)}
    sig = signature(arrays)
    request = codec.encode_request(arrays)
    if case == "complex":
        arrays = {"x": np.array([1 + 2j], np.complex64)}
        sig, request = signature(arrays), codec.encode_request(arrays)
    elif case == "half":
        arrays = {"x": np.array([1.5], np.float16)}
        sig, request = signature(arrays), codec.encode_request(arrays)
    elif case == "unknown key":
        request = codec.encode_request({"z": arrays["x"]})
    elif case == "unpacked floats":  # inputs entry {key "x", value {dtype 1, float_val 1.0 unpacked}}
        value = b"\x08\x01\x1d" + np.float32(1.0).tobytes()
        entry = b"\x0a\x01x\x12" + bytes([len(value)]) + value
        request = b"\x12" + bytes([len(entry)]) + entry
    elif case == "fixed32 field":
        request += b"\x25" + b"\x00" * 4  # field 4, wire type 5, at the top level
    elif case == "truncated":
        request = request[:-3]
    elif case == "field zero":
        request += b"\x02\x00"
    elif case == "values in the wrong field":  # DT_FLOAT with double_val
        value = b"\x08\x01\x22\x08" + np.float64(1.0).tobytes()
        entry = b"\x0a\x01x\x12" + bytes([len(value)]) + value
        request = b"\x12" + bytes([len(entry)]) + entry
    pending = served(request, {"y": np.array([1.0], np.float32)}, sig)
    assert tail_both(request, pending.result.outputs, sig) is None
    record = parsed(formats.prediction_log_pending(pending, 1.0))  # the decoding path's record
    assert ours(formats.prediction_log_pending(pending, 1.0)).log_metadata.request_id == "rid-7"
    np.testing.assert_array_equal(tf.make_ndarray(record.predict_log.response.outputs["y"]), [1.0])


def test_a_large_call_transcodes_outside_the_gil_to_the_same_bytes():
    rng = np.random.default_rng(3)
    arrays = {"ids": rng.integers(0, 2**40, (512, 26)), "dense": rng.random((512, 13), np.float32),
              "tokens": np.array([[b"t%d" % i for i in range(6)]] * 512, dtype=object)}
    sig = signature(arrays)
    request = codec.encode_request(arrays)
    response = codec.encode_response({"y": rng.random((512, 1), np.float32)})
    if native.MODULE is not None:
        assert len(request) > native.MODULE.RELEASE_GIL_BYTES
    tail = tail_both(request, response, sig)
    entry = prediction_log_pb2.PredictionLog.FromString(tail)
    for key, array in arrays.items():
        np.testing.assert_array_equal(tf.make_ndarray(entry.predict_log.request.inputs[key]), array)
