"""The native gRPC server's transcoders (native/grpc_server/transcode.h): TF Serving's
PredictRequest and KServe v2's ModelInferRequest into our PredictRequest, our PredictResponse
back into theirs, checked against the Python handlers' own readers and writers (the reference):
what a transcoder takes it reads as Python reads it, what it writes parses to the message Python
writes; what it does not take (None) Python answers. Random mutations of valid requests never
crash it, and whatever it still takes reads as Python reads those bytes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from processor import codec
from processor.proto import grpc_predict_v2_pb2 as pb
from processor.proto import predict_pb2
from processor.signature import TensorSpec
from server.kserve import grpc_service as v2_service
from server.kserve import open_inference as oip
from sp_checks import set_model_spec

native = pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built "
                             "(gRPC's C++ library, libgrpc++-dev, missing)")
messages = pytest.importorskip("server.tfserving.messages").messages
tensor_proto = pytest.importorskip("server.tfserving.tensor_proto")

NUMERIC = [np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8, np.int16, np.uint16, np.bool_]
SHAPES = [(3, 4), (), (0, 2), (5,)]


def _array(dtype, shape, rng: np.random.Generator) -> np.ndarray:
    if dtype is bytes:
        out = np.empty(shape, object)
        for i in np.ndindex(*shape):
            out[i] = bytes(rng.integers(0, 256, int(rng.integers(0, 6)), dtype=np.uint8))
        return out
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 1e3).astype(dtype)


def _eas_arrays(data: bytes) -> tuple[dict[str, np.ndarray], list[str]]:
    """Our PredictRequest's inputs as Python's decoder reads them, and its output_filter."""
    request = codec.parse_request(data)
    out = {}
    for key, proto in request.inputs.items():
        out[key] = codec.array_from_proto(proto, TensorSpec(key, key, proto.dtype, tuple(proto.array_shape.dim)))
    return out, list(request.output_filter)


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == object:
        assert list(a.ravel()) == list(b.ravel())
    else:
        assert a.tobytes() == b.tobytes()  # exact: a conversion of bytes, no arithmetic


# --- TF Serving ---------------------------------------------------------------------------------

def _tfs_request(inputs: dict[str, np.ndarray], content: bool, **spec):
    m = messages()
    request = m.PredictRequest()
    set_model_spec(request.model_spec, spec.pop("name", "m"), **spec)
    for key, array in inputs.items():
        tensor_proto.from_numpy(array, request.inputs[key], content)
    return request


@pytest.mark.parametrize("content", [True, False], ids=["tensor_content", "typed"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_tfs_request_reads_as_python_reads_it(content, shape):
    rng = np.random.default_rng(7)
    inputs = {f"in_{np.dtype(t).name}": _array(t, shape, rng) for t in NUMERIC}
    inputs["text"] = _array(bytes, shape, rng)
    request = _tfs_request(inputs, content, signature_name="sig")
    request.output_filter.extend(["b", "a"])
    model, signature, eas = native.tfs_request(request.SerializeToString())
    assert (model, signature) == ("m", "sig")
    got, output_filter = _eas_arrays(eas)
    assert output_filter == ["b", "a"]
    assert set(got) == set(inputs)
    for key, proto in request.inputs.items():
        _same(got[key], tensor_proto.to_numpy(key, proto))


def test_what_a_tfs_request_leaves_to_python():
    rng = np.random.default_rng(1)
    plain = {"x": _array(np.float32, (2, 3), rng)}
    assert native.tfs_request(_tfs_request(plain, True).SerializeToString()) is not None
    cases = {
        "a version": _tfs_request(plain, True, version=3),
        "a label": _tfs_request(plain, True, version_label="canary"),
        "no model name": _tfs_request(plain, True, name=""),
        "a half input": _tfs_request({"x": _array(np.float16, (2,), rng)}, False),
    }
    broadcast = _tfs_request({}, False)  # one value for a shape of six: TensorFlow broadcasts it
    broadcast.inputs["x"].dtype = 1
    broadcast.inputs["x"].tensor_shape.dim.add(size=6)
    broadcast.inputs["x"].float_val.append(1.5)
    cases["a broadcast"] = broadcast
    unknown = _tfs_request(plain, True)
    unknown.inputs["x"].tensor_shape.unknown_rank = True
    cases["unknown rank"] = unknown
    short = _tfs_request(plain, True)
    short.inputs["x"].tensor_content = short.inputs["x"].tensor_content[:-4]
    cases["a short tensor_content"] = short
    both = _tfs_request(plain, True)
    both.inputs["x"].float_val.append(1.0)
    cases["content and values"] = both
    flag = _tfs_request({"b": np.array([True, False])}, True)
    flag.inputs["b"].tensor_content = b"\x02\x00"
    cases["a bool byte of 2"] = flag
    for what, request in cases.items():
        assert native.tfs_request(request.SerializeToString()) is None, what
    assert native.tfs_request(b"\xff\xff\xff") is None


def _outputs(rng) -> dict[str, np.ndarray]:
    out = {f"o_{np.dtype(t).name}": _array(t, (2, 3), rng) for t in NUMERIC}
    out["o_half"] = _array(np.float16, (4,), rng)
    out["o_half"][:3] = [np.float16(6e-8), np.float16(-np.inf), np.float16(65504)]  # subnormal, inf, max
    out["o_text"] = _array(bytes, (3,), rng)
    out["o_scalar"] = np.float32(2.5).reshape(())
    out["o_empty"] = np.zeros((0, 4), np.int64)
    return dict(sorted(out.items()))


@pytest.mark.parametrize("content", [True, False], ids=["tensor_content", "typed"])
def test_a_tfs_response_is_the_one_python_writes(content):
    m = messages()
    outputs = _outputs(np.random.default_rng(3))
    data = native.tfs_response(codec.encode_response(outputs), "m", 12, "serving_default", content)
    got = m.PredictResponse.FromString(data)
    want = m.PredictResponse()  # server/tfserving/grpc_service.py TfsService._response
    want.model_spec.name = "m"
    want.model_spec.version.value = 12
    want.model_spec.signature_name = "serving_default"
    for key, array in outputs.items():
        tensor_proto.from_numpy(array, want.outputs[key], content)
    assert got == want
    for key, array in outputs.items():  # and it reads back as the arrays
        _same(tensor_proto.to_numpy(key, got.outputs[key]), np.asarray(array))


# --- KServe v2 ----------------------------------------------------------------------------------

V2_TYPES = {np.float32: "FP32", np.float64: "FP64", np.int32: "INT32", np.int64: "INT64", np.int8: "INT8",
            np.uint8: "UINT8", np.int16: "INT16", np.uint16: "UINT16", np.bool_: "BOOL", bytes: "BYTES"}


def _v2_request(inputs: dict[str, np.ndarray], **fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", **fields)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=oip.datatype_of(array), shape=array.shape)
        request.raw_input_contents.append(oip.raw_bytes(array))
    return request


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_v2_request_reads_as_python_reads_it(shape):
    rng = np.random.default_rng(11)
    inputs = {f"in_{name}": _array(t, shape, rng) for t, name in V2_TYPES.items()}
    request = _v2_request(inputs, model_version="4", id="req-1")
    request.outputs.add(name="b")
    request.outputs.add(name="a")
    model, version, rid, eas = native.v2_request(request.SerializeToString())
    assert (model, version, rid) == ("m", "4", "req-1")
    got, output_filter = _eas_arrays(eas)
    assert output_filter == ["b", "a"]
    for tensor in v2_service._inputs(request):
        _same(got[tensor.name], oip.to_array(tensor))


def _every_varint_length(dtype) -> np.ndarray:
    """Integers whose varints take every length from 1 to 10 bytes (negatives: 10), in an order
    that puts each length at the payload's end too (the writer's last bytes have no slack)."""
    info = np.iinfo(dtype)
    edges = [0, 1, info.max, info.min, -1] + [int(s * (1 << k) + d) for k in range(info.bits - 1)
                                              for s in (1, -1) for d in (-1, 0)]
    values = np.array([v for v in edges if info.min <= v <= info.max], dtype=dtype)
    return np.concatenate([values, values[::-1], values[:7]])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.int8, np.uint16, np.uint8])
def test_integers_of_every_varint_length_read_as_python_reads_them(dtype):
    for size in (1, 2, 9, 10, 11, 40):  # the tail written without slack, alone and after others
        values = _every_varint_length(dtype)[-size:]
        tfs = _tfs_request({"x": values}, True)
        v2 = _v2_request({"x": values})
        for eas in (native.tfs_request(tfs.SerializeToString())[-1], native.v2_request(v2.SerializeToString())[-1]):
            got, _ = _eas_arrays(eas)
            _same(got["x"], values)


def test_what_a_v2_request_leaves_to_python():
    rng = np.random.default_rng(2)
    plain = {"x": _array(np.float32, (2, 3), rng)}
    assert native.v2_request(_v2_request(plain).SerializeToString()) is not None
    cases = {"no model name": _v2_request(plain)}
    cases["no model name"].model_name = ""
    cases["parameters"] = _v2_request(plain)
    cases["parameters"].parameters["priority"].int64_param = 1
    cases["an FP16 input"] = _v2_request({"x": _array(np.float16, (2,), rng)})
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
    cases["typed contents"] = typed
    missing = _v2_request(plain)
    missing.raw_input_contents.append(b"")
    cases["an extra raw entry"] = missing
    short = _v2_request(plain)
    short.raw_input_contents[0] = short.raw_input_contents[0][:-1]
    cases["short raw contents"] = short
    text = _v2_request({"t": _array(bytes, (2,), rng)})
    text.raw_input_contents[0] += b"\x01"
    cases["bytes past the elements"] = text
    asked = _v2_request(plain)
    asked.outputs.add(name="y").parameters["binary_data"].bool_param = True
    cases["output parameters"] = asked
    negative = _v2_request(plain)
    negative.inputs[0].shape[0] = -2
    cases["a negative dim"] = negative
    for what, request in cases.items():
        assert native.v2_request(request.SerializeToString()) is None, what


def test_a_v2_response_is_the_one_python_writes():
    outputs = _outputs(np.random.default_rng(5))
    data = native.v2_response(codec.encode_response(outputs), "m", "12", "req-9")
    got = pb.ModelInferResponse.FromString(data)
    want = v2_service._response(pb.ModelInferRequest(model_name="m", id="req-9"), "12", outputs)
    assert got == want


# --- fuzzed bytes -------------------------------------------------------------------------------

def _mutations(data: bytes, rng: random.Random, n: int):
    for _ in range(n):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            at = rng.randrange(len(b)) if b else 0
            if kind < 0.5 and b:
                b[at] = rng.randrange(256)
            elif kind < 0.75 and b:
                del b[at:at + rng.randint(1, 8)]
            else:
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        yield bytes(b)


def test_fuzzed_requests_never_crash_and_read_as_python_reads_them():
    rng = random.Random(5)
    nprng = np.random.default_rng(5)
    tfs_seed = _tfs_request({"x": _array(np.int64, (2, 3), nprng), "s": _array(bytes, (2,), nprng)},
                            True).SerializeToString()
    m = messages()
    taken = 0
    for data in _mutations(tfs_seed, rng, 1500):
        out = native.tfs_request(data)
        if out is None:
            continue
        taken += 1
        request = m.PredictRequest.FromString(data)  # what it took is a message Python reads
        got, _ = _eas_arrays(out[2])
        assert out[0] == request.model_spec.name
        for key, proto in request.inputs.items():
            _same(got[key], tensor_proto.to_numpy(key, proto))
    v2_seed = _v2_request({"x": _array(np.int32, (2, 3), nprng), "s": _array(bytes, (2,), nprng)},
                          id="r").SerializeToString()
    for data in _mutations(v2_seed, rng, 1500):
        out = native.v2_request(data)
        if out is None:
            continue
        taken += 1
        request = pb.ModelInferRequest.FromString(data)
        got, _ = _eas_arrays(out[3])
        for tensor in v2_service._inputs(request):
            _same(got[tensor.name], oip.to_array(tensor))
    assert taken > 0  # some mutations land in values, which stay plain requests
