import re

import ml_dtypes
import numpy as np
import pytest

from processor import codec
from processor.dtypes import WIRE_TYPES, DT_FLOAT, DT_HALF, DT_BFLOAT16, DT_INT64, DT_STRING
from processor.errors import InvalidArgument
from processor.proto import predict_pb2
from processor.signature import Signature, TensorSpec

ALL_DTYPES = {
    "f32": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16, "i32": np.int32,
    "i64": np.int64, "u8": np.uint8, "u16": np.uint16, "b": np.bool_, "f16": np.float16,
    "bf16": ml_dtypes.bfloat16, "c64": np.complex64, "c128": np.complex128,
}


def sample(dtype, shape=(2, 3)):
    n = int(np.prod(shape))
    if dtype is np.bool_:
        return (np.arange(n) % 2 == 0).reshape(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        return (np.arange(n) + 1j * np.arange(n)).astype(dtype).reshape(shape)
    return (np.arange(n) - 2).astype(dtype).reshape(shape)


def sig_for(arrays: dict, free_batch=True) -> Signature:
    from processor.dtypes import dtype_of_array

    inputs = {k: TensorSpec(k, f"{k}:0", dtype_of_array(np.asarray(v)),
                            (-1,) + np.asarray(v).shape[1:] if free_batch else np.asarray(v).shape)
              for k, v in arrays.items()}
    outputs = {"out": TensorSpec("out", "out:0", DT_FLOAT, (-1, 1))}
    return Signature("serving_default", inputs, outputs)


@pytest.mark.parametrize("name", sorted(ALL_DTYPES))
def test_round_trip_every_dtype(name):
    array = sample(ALL_DTYPES[name])
    data = codec.encode_request({"t": array})
    decoded = codec.decode_request(data, sig_for({"t": array}))
    got = decoded.feeds["t"]
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)


def test_strings_round_trip_as_bytes():
    array = np.array([[b"a", b"bc"], [b"\x00\xff", b""]], dtype=object)
    decoded = codec.decode_request(codec.encode_request({"s": array}), sig_for({"s": array}))
    assert decoded.feeds["s"].tolist() == array.tolist()


def test_half_and_bfloat16_accept_raw_bits_in_int_val():
    for dt, np_type in ((DT_HALF, np.float16), (DT_BFLOAT16, ml_dtypes.bfloat16)):
        values = np.array([1.5, -2.0, 0.25], dtype=np_type)
        req = predict_pb2.PredictRequest()
        a = req.inputs["h"]
        a.dtype = dt
        a.array_shape.dim[:] = [3]
        a.int_val[:] = values.view(np.uint16).tolist()
        sig = Signature("s", {"h": TensorSpec("h", "h:0", dt, (-1,))}, {})
        got = codec.decode_message(req, sig).feeds["h"]
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, values)


def test_response_round_trip():
    outputs = {"p": np.array([[0.25], [0.75]], np.float32), "ids": np.array([1, 2], np.int64)}
    back = codec.decode_response(codec.encode_response(outputs))
    for k in outputs:
        np.testing.assert_array_equal(back[k], outputs[k])
        assert back[k].dtype == outputs[k].dtype


SIG = Signature(
    "serving_default",
    {"x": TensorSpec("x", "x:0", DT_FLOAT, (-1, 2)), "ids": TensorSpec("ids", "ids:0", DT_INT64, (-1,))},
    {"y": TensorSpec("y", "y:0", DT_FLOAT, (-1, 1)), "z": TensorSpec("z", "z:0", DT_FLOAT, (-1,))},
)
GOOD = {"x": np.ones((3, 2), np.float32), "ids": np.arange(3, dtype=np.int64)}


def test_aliases_and_tensor_names_are_both_accepted():
    d = codec.decode_request(codec.encode_request({"x:0": GOOD["x"], "ids": GOOD["ids"]}, ["y:0"]), SIG)
    assert set(d.feeds) == {"x", "ids"}
    assert d.fetches == (("y:0", "y"),)


def test_empty_output_filter_means_all_outputs():
    d = codec.decode_request(codec.encode_request(GOOD), SIG)
    assert d.fetches == (("y", "y"), ("z", "z"))


def _bad(req_inputs=None, output_filter=None, raw=None):
    data = raw if raw is not None else codec.encode_request(req_inputs, output_filter)
    with pytest.raises(InvalidArgument) as err:
        codec.decode_request(data, SIG)
    return err.value.message


def test_bad_requests_are_invalid_argument_with_a_message():
    assert "not a serialized" in _bad(raw=b"\xff\xff\xff garbage")
    assert "unknown input 'w'" in _bad({**GOOD, "w": np.ones(1, np.float32)})
    assert "dtype DT_DOUBLE given" in _bad({**GOOD, "x": np.ones((3, 2))})
    assert "rank 1" in _bad({**GOOD, "x": np.ones(6, np.float32)})
    assert "shape [3, 3] given" in _bad({**GOOD, "x": np.ones((3, 3), np.float32)})
    assert "missing input(s) ['ids']" in _bad({"x": GOOD["x"]})
    assert "empty name" in _bad(GOOD, [""])
    assert "unknown output 'q'" in _bad(GOOD, ["q"])
    assert "given twice" in _bad({**GOOD, "x:0": GOOD["x"]})


def test_value_count_must_match_shape():
    req = predict_pb2.PredictRequest()
    codec.fill_proto(req.inputs["x"], GOOD["x"])
    codec.fill_proto(req.inputs["ids"], GOOD["ids"])
    req.inputs["x"].array_shape.dim[:] = [4, 2]
    with pytest.raises(InvalidArgument, match="holds 8 values but 6 were given"):
        codec.decode_message(req, SIG)


def test_unsupported_dtypes_are_rejected():
    req = predict_pb2.PredictRequest()
    req.inputs["r"].dtype = 20  # DT_RESOURCE
    sig = Signature("s", {"r": TensorSpec("r", "r:0", 20, None)}, {})
    with pytest.raises(InvalidArgument, match="not supported"):
        codec.decode_message(req, sig)


def test_every_wire_type_has_a_field_on_the_proto():
    fields = predict_pb2.ArrayProto.DESCRIPTOR.fields_by_name
    for wire in WIRE_TYPES.values():
        assert wire.field in fields
    assert DT_STRING in WIRE_TYPES


def test_numpy_inputs_are_checked_like_protobuf_ones():
    d = codec.decode_arrays({"x:0": GOOD["x"], "ids": GOOD["ids"]}, ["y"], SIG)
    assert set(d.feeds) == {"x", "ids"} and d.fetches == (("y", "y"),)
    for inputs, output_filter, fragment in [
        ({**GOOD, "w": np.ones(1, np.float32)}, None, "unknown input 'w'"),
        ({**GOOD, "x": np.ones((3, 2))}, None, "dtype DT_DOUBLE given"),
        ({**GOOD, "x": np.ones((3, 3), np.float32)}, None, "shape [3, 3] given"),
        ({"x": GOOD["x"]}, None, "missing input(s) ['ids']"),
        (GOOD, [""], "empty name"),
        ({**GOOD, "x": [[1.0, 2.0], [3.0]]}, None, "bad value"),
    ]:
        with pytest.raises(InvalidArgument, match=re.escape(fragment)):
            codec.decode_arrays(inputs, output_filter, SIG)


def test_numpy_strings_become_bytes():
    sig = Signature("s", {"s": TensorSpec("s", "s:0", DT_STRING, (-1,))}, {})
    got = codec.decode_arrays({"s": np.array(["a", "é"])}, None, sig).feeds["s"]
    assert got.dtype == object and got.tolist() == [b"a", "é".encode()]
