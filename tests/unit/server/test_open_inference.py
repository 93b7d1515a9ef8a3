"""server.kserve.open_inference: v2 tensors to numpy and back, and the errors that name the tensor."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from processor.errors import InvalidArgument
from server.kserve import open_inference as oip


@pytest.mark.parametrize("datatype, array", [
    ("BOOL", np.array([[True, False]])), ("UINT8", np.array([1, 255], np.uint8)),
    ("INT8", np.array([-128, 127], np.int8)), ("INT16", np.array([[-3], [4]], np.int16)),
    ("UINT16", np.array([65535], np.uint16)), ("INT32", np.array([1, -2], np.int32)),
    ("INT64", np.array([2**40, -1], np.int64)), ("UINT32", np.array([7], np.uint32)),
    ("UINT64", np.array([2**63], np.uint64)), ("FP16", np.array([0.5, -2], np.float16)),
    ("FP32", np.array([[1.5, 2]], np.float32)), ("FP64", np.array([1e300], np.float64)),
    ("BF16", np.array([1.5, -2, 3e38], ml_dtypes.bfloat16)),
    ("BYTES", np.array([b"a", b"", "\u00e9".encode()], object)),
])
def test_raw_contents_round_trip_every_datatype(datatype, array):
    assert oip.datatype_of(array) == datatype
    back = oip.to_array(oip.InferInput("t", datatype, array.shape, raw=oip.raw_bytes(array)))
    assert back.dtype == oip.DATATYPES[datatype] and back.shape == array.shape
    assert back.tolist() == array.tolist()


def test_json_data_nested_or_flat_and_back():
    nested = oip.to_array(oip.InferInput("t", "FP32", (2, 2), data=[[1, 2], [3, 4.5]]))
    flat = oip.to_array(oip.InferInput("t", "FP32", (2, 2), data=[1, 2, 3, 4.5]))
    assert nested.tolist() == flat.tolist() == [[1, 2], [3, 4.5]] and nested.dtype == np.float32
    assert oip.json_data("t", nested) == [1, 2, 3, 4.5]
    strings = oip.to_array(oip.InferInput("s", "BYTES", (2,), data=["caf\u00e9", "x"]))
    assert strings.tolist() == ["caf\u00e9".encode(), b"x"] and oip.json_data("s", strings) == ["caf\u00e9", "x"]
    deep = [1.0]
    for _ in range(5000):  # no recursion
        deep = [deep]
    assert oip.to_array(oip.InferInput("t", "FP64", (1,), data=deep)).tolist() == [1.0]


@pytest.mark.parametrize("tensor, words", [
    (oip.InferInput("t", "FP8", (1,), data=[1]), "unknown datatype"),
    (oip.InferInput("t", "FP32", (-1,), data=[1]), "non-negative"),
    (oip.InferInput("t", "FP32", (3,), data=[1, 2]), "2 elements for a shape of 3"),
    (oip.InferInput("t", "FP32", (2,), data=[1, True]), "numbers"),
    (oip.InferInput("t", "FP32", (1,), data=["1"]), "numbers"),
    (oip.InferInput("t", "INT8", (1,), data=[128]), "[-128, 127]"),
    (oip.InferInput("t", "INT32", (1,), data=[1.5]), "integers"),
    (oip.InferInput("t", "BOOL", (1,), data=[0]), "true/false"),
    (oip.InferInput("t", "BYTES", (1,), data=[1]), "strings"),
    (oip.InferInput("t", "FP32", (1,), data=None), "no data"),
    (oip.InferInput("t", "FP32", (1,), data={"a": 1}), "JSON array"),
    (oip.InferInput("t", "FP32", (2,), raw=b"\0" * 4), "4 raw bytes for 2 elements"),
    (oip.InferInput("t", "BYTES", (1,), raw=b"\1\0"), "length prefix"),
    (oip.InferInput("t", "BYTES", (1,), raw=struct.pack("<I", 9) + b"ab"), "runs past"),
    (oip.InferInput("t", "BYTES", (2,), raw=struct.pack("<I", 1) + b"a"), "1 BYTES elements for a shape of 2"),
    (oip.InferInput("t", "BYTES", (1,), raw=struct.pack("<I", 0) * 3), "more BYTES elements than the shape's 1"),
    (oip.InferInput("t", "BOOL", (2,), raw=b"\1\2"), "bytes 0 (false) or 1 (true)"),
    (oip.InferInput("t", "FP32", (0, 4611686018427387904), raw=b""), "too large"),
    (oip.InferInput("t", "FP32", (0, 10**30), raw=b""), "64-bit"),
    (oip.InferInput("t", "FP32", (0,) * 65, raw=b""), "at most 32"),
    (oip.InferInput("t", "FP32", (1,), data=[1e39]), "within"),
    (oip.InferInput("t", "BF16", (1,), data=[1e39]), "within"),
])
def test_tensors_that_do_not_fit_are_refused_naming_the_tensor(tensor, words):
    with pytest.raises(InvalidArgument) as info:
        oip.to_array(tensor)
    assert "'t'" in str(info.value) and words in str(info.value)


def test_echoed_values_are_short():
    with pytest.raises(InvalidArgument) as info:
        oip.to_array(oip.InferInput("t", "X" * 100_000, (1,), data=[1]))
    assert len(str(info.value)) < 400


def test_bf16_json_goes_through_float32_and_bool_outputs_are_0_or_1():
    back = oip.to_array(oip.InferInput("t", "BF16", (2,), data=[1.5, -0.25]))
    assert back.dtype == ml_dtypes.bfloat16 and back.astype(np.float32).tolist() == [1.5, -0.25]
    assert oip.json_data("t", back) == [1.5, -0.25]
    odd = np.frombuffer(b"\0\3", np.uint8).view(np.bool_)
    assert oip.raw_bytes(odd) == b"\0\1"


@pytest.mark.parametrize("array, words", [
    (np.array([1.0, np.nan], np.float32), "NaN or Infinity"),
    (np.array([np.inf], np.float16), "NaN or Infinity"),
    (np.array([b"\xff"], object), "not UTF-8"),
])
def test_json_outputs_refuse_what_json_cannot_carry(array, words):
    with pytest.raises(InvalidArgument) as info:
        oip.json_data("out", array)
    assert words in str(info.value) and "binary_data_output" in str(info.value)


def test_numbers_out_of_range_print_no_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidArgument):
            oip.to_array(oip.InferInput("t", "FP16", (1,), data=[1e300]))
        assert np.isnan(oip.to_array(oip.InferInput("t", "FP32", (1,), data=[float("nan")]))[0])


# --- the raw binary form (Inference-Header-Content-Length: 0; issue 51) -------------------------

def _rt_serving(*specs):
    """A runtime stand-in whose model serves a signature of ``specs`` (alias, dtype, shape)."""
    from types import SimpleNamespace

    from processor.signature import Signature, TensorSpec

    inputs = {alias: TensorSpec(alias, f"{alias}:0", dtype, shape) for alias, dtype, shape in specs}
    served = SimpleNamespace(signature=Signature("serving_default", inputs, {}))
    return SimpleNamespace(dataplane=SimpleNamespace(served=lambda name, version: served))


@pytest.mark.parametrize("shape, raw, expected", [
    ((-1, 2), np.arange(6, dtype=np.float32).tobytes(), (3, 2)),    # the batch inferred
    ((2, -1), np.arange(6, dtype=np.float32).tobytes(), (2, 3)),    # any one variable dimension
    ((3,), np.arange(3, dtype=np.float32).tobytes(), (3,)),          # fixed: the count must fit
    (None, np.arange(4, dtype=np.float32).tobytes(), (4,)),          # unknown rank: a vector
    ((-1, 1), b"", (0, 1)),                                           # an empty batch
])
def test_raw_input_takes_the_shape_from_the_signature(shape, raw, expected):
    from processor.dtypes import DT_FLOAT

    tensor = oip.raw_input(_rt_serving(("x", DT_FLOAT, shape)), "m", None, raw)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "FP32", expected)
    assert oip.to_array(tensor).tolist() == np.frombuffer(raw, np.float32).reshape(expected).tolist()


def test_raw_input_counts_bytes_elements_by_their_prefixes():
    from processor.dtypes import DT_STRING

    words = np.array([b"ab", b"", b"\xff" * 5], object)
    tensor = oip.raw_input(_rt_serving(("w", DT_STRING, (-1,))), "m", None, oip.raw_bytes(words))
    assert tensor.shape == (3,) and oip.to_array(tensor).tolist() == words.tolist()


@pytest.mark.parametrize("specs, raw, words", [
    ((("a", 1, (-1,)), ("b", 1, (-1,))), b"\0" * 8, "has 2 inputs ('a', 'b')"),
    ((("x", 1, (-1, 3)),), b"\0" * 7, "not a whole number of FP32"),
    ((("x", 1, (-1, 3)),), b"\0" * 16, "4 FP32 elements do not fit its shape [-1, 3]"),
    ((("x", 1, (2,)),), b"\0" * 12, "3 FP32 elements do not fit its shape [2]"),
    ((("x", 1, (-1, -1)),), b"\0" * 16, "2 variable dimensions"),
    ((("w", 7, (-1,)),), b"\1\0\0", "inside a length prefix"),
    ((("w", 7, (-1,)),), b"\9\0\0\0ab", "runs past"),
])
def test_raw_input_refuses_what_the_byte_count_cannot_say(specs, raw, words):
    with pytest.raises(InvalidArgument, match=r"(?s).*" + __import__("re").escape(words)):
        oip.raw_input(_rt_serving(*specs), "m", None, raw)
