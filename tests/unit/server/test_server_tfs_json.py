"""TF Serving REST JSON <-> numpy, the REST path grammar, TensorProto conversion, version rules."""

import base64
import json

import numpy as np
import pytest

from processor import request as call_checks
from processor.dtypes import DT_BOOL, DT_FLOAT, DT_INT32, DT_INT64, DT_STRING
from processor.errors import InvalidArgument, NotFound, PayloadTooLarge
from processor.signature import Signature, TensorSpec
from processor.store.model_version import ModelVersion
from server.tfserving import rest_json as tfs_json
from server.tfserving import rest_json_encode as tfs_json_encode
from server.tfserving.rest_routes import STATUS_PATH
from server.tfserving.rest_predict import PREDICT_PATH as _PREDICT_PATH

TOY = Signature("serving_default", {"x": TensorSpec("x", "x:0", DT_FLOAT, (-1, 1))},
                {"y": TensorSpec("y", "y:0", DT_FLOAT, (-1, 1))})
MULTI = Signature("serving_default", {
    "dense": TensorSpec("dense", "dense:0", DT_FLOAT, (-1, 2)),
    "ids": TensorSpec("ids", "ids:0", DT_INT64, (-1, 3)),
    "tokens": TensorSpec("tokens", "tokens:0", DT_STRING, (-1, 2)),
    "flag": TensorSpec("flag", "flag:0", DT_BOOL, (-1,)),
}, {"p": TensorSpec("p", "p:0", DT_FLOAT, (-1, 1))})


def decode(doc, sig=TOY):
    return tfs_json.decode_predict(doc, sig)


def test_row_single_input_plain_values():
    arrays, fmt = decode({"instances": [[1.0], [2.5]]})
    assert fmt == tfs_json.ROW
    assert arrays["x"].dtype == np.float32 and arrays["x"].tolist() == [[1.0], [2.5]]


def test_row_objects_and_columnar_map():
    rows = [{"dense": [1, 2], "ids": [1, 2, 3], "tokens": ["a", {"b64": base64.b64encode(b"\xff").decode()}],
             "flag": True},
            {"dense": [3.5, 4], "ids": [4, 5, 6], "tokens": ["c", "d"], "flag": False}]
    arrays, fmt = decode({"instances": rows}, MULTI)
    assert fmt == tfs_json.ROW
    assert arrays["dense"].dtype == np.float32 and arrays["dense"].shape == (2, 2)
    assert arrays["ids"].dtype == np.int64 and arrays["ids"][1].tolist() == [4, 5, 6]
    assert arrays["tokens"].dtype == object and arrays["tokens"][0].tolist() == [b"a", b"\xff"]
    assert arrays["flag"].tolist() == [True, False]
    cols, fmt = decode({"inputs": {"dense": [[1, 2]], "ids": [[1, 2, 3]], "tokens": [["a", "b"]],
                                   "flag": [True]}}, MULTI)
    assert fmt == tfs_json.COLUMNAR and cols["ids"].shape == (1, 3)


def test_columnar_bare_value_and_nan_tokens():
    doc = tfs_json.parse_body(b'{"inputs": [[NaN], [Infinity], [-Infinity]]}')
    arrays, fmt = decode(doc)
    assert fmt == tfs_json.COLUMNAR
    x = arrays["x"][:, 0]
    assert np.isnan(x[0]) and x[1] == np.inf and x[2] == -np.inf


@pytest.mark.parametrize("body, message", [
    (b"", "JSON Parse error"),
    (b"{nope", "JSON Parse error"),
    (b"\xff\xfe", "JSON Parse error"),
    (b"[1, 2]", "JSON Value is not an object"),
])
def test_malformed_json(body, message):
    with pytest.raises(InvalidArgument, match=message):
        tfs_json.parse_body(body)


@pytest.mark.parametrize("doc, sig, message", [
    ({}, TOY, "Missing 'inputs' or 'instances' key"),
    ({"instances": [[1.0]], "inputs": [[1.0]]}, TOY, "Not both"),
    ({"instances": {"x": [1.0]}}, TOY, "'instances' must be a list"),
    ({"instances": []}, TOY, "empty"),
    ({"instances": [["a"]]}, TOY, "input 'x' expects numbers"),
    ({"instances": [[1.0], [1.0, 2.0]]}, TOY, "ragged"),
    ({"instances": [[None]]}, TOY, "expects numbers"),
    ({"instances": [{"z": [1.0]}]}, TOY, "unknown input 'z'"),
    ({"instances": [{"x": [1.0]}, {"y": [1.0]}]}, TOY, "every example must name the same inputs"),
    ({"instances": [{"x": [1.0]}, [1.0]]}, TOY, "mixes objects"),
    ({"instances": [[1.0]]}, MULTI, "takes 4 inputs"),
    ({"inputs": {}}, TOY, "empty"),
    ({"inputs": {"ids": [[1.5, 2, 3]]}}, MULTI, "input 'ids' expects integers"),
    ({"inputs": {"ids": [[2 ** 70, 2, 3]]}}, MULTI, "input 'ids'"),
    ({"inputs": {"flag": [1]}}, MULTI, "input 'flag' expects true/false"),
    ({"inputs": {"tokens": [[1, 2]]}}, MULTI, "input 'tokens' expects strings"),
    ({"inputs": {"tokens": [[{"b64": "!!!"}, "a"]]}}, MULTI, "invalid base64"),
    ({"inputs": {"tokens": [[{"b64": 5}, "a"]]}}, MULTI, "must be a string"),
    ({"inputs": {"tokens": [["a"], ["b", "c"]]}}, MULTI, "ragged"),
])
def test_bad_requests_name_the_problem(doc, sig, message):
    with pytest.raises(InvalidArgument, match=message):
        decode(doc, sig)


def test_int32_range_checked():
    sig = Signature("s", {"i": TensorSpec("i", "i:0", DT_INT32, (-1,))}, {})
    with pytest.raises(InvalidArgument, match="out of range"):
        decode({"inputs": [2 ** 40]}, sig)


def test_encode_row_and_columnar():
    one = {"y": np.array([[2.5], [3.0]], np.float32)}
    assert json.loads(tfs_json_encode.encode_predict(one, tfs_json.ROW)) == {"predictions": [[2.5], [3.0]]}
    assert json.loads(tfs_json_encode.encode_predict(one, tfs_json.COLUMNAR)) == {"outputs": [[2.5], [3.0]]}
    two = {"p": np.array([0.1, 0.2], np.float64), "label": np.array([b"a", b"b"], dtype=object)}
    assert json.loads(tfs_json_encode.encode_predict(two, tfs_json.ROW)) == {
        "predictions": [{"p": 0.1, "label": "a"}, {"p": 0.2, "label": "b"}]}
    assert json.loads(tfs_json_encode.encode_predict(two, tfs_json.COLUMNAR)) == {
        "outputs": {"p": [0.1, 0.2], "label": ["a", "b"]}}


def test_encode_bytes_outputs_as_b64():
    out = {"img_bytes": np.array([b"\x00\x01"], dtype=object), "name": np.array([b"\xff"], dtype=object)}
    body = json.loads(tfs_json_encode.encode_predict(out, tfs_json.COLUMNAR))["outputs"]
    assert body["img_bytes"] == [{"b64": base64.b64encode(b"\x00\x01").decode()}]
    assert body["name"] == [{"b64": base64.b64encode(b"\xff").decode()}]  # not UTF-8


def test_row_response_needs_equal_batch():
    out = {"a": np.zeros((2, 1), np.float32), "b": np.zeros((3,), np.float32)}
    with pytest.raises(InvalidArgument, match="columnar"):
        tfs_json_encode.encode_predict(out, tfs_json.ROW)


@pytest.mark.parametrize("path, groups", [
    ("/v1/models/toy:predict", ("toy", None, None, "predict")),
    ("/v1/models/toy/versions/12:predict", ("toy", "12", None, "predict")),
    ("/v1/models/toy/labels/stable:PREDICT", ("toy", None, "stable", "PREDICT")),
    ("/V1/Models/toy:classify", ("toy", None, None, "classify")),
])
def test_predict_path_grammar(path, groups):
    assert _PREDICT_PATH.match(path).groups() == groups


@pytest.mark.parametrize("path", ["/v1/models/toy", "/v1/models/toy/versions/x:predict",
                                  "/v1/models/toy:explain", "/v1/models/:predict"])
def test_predict_path_rejects(path):
    assert _PREDICT_PATH.match(path) is None


@pytest.mark.parametrize("path, groups", [
    ("/v1/models/toy", ("toy", None, None, None)),
    ("/v1/models/toy/versions/3", ("toy", "3", None, None)),
    ("/v1/models/toy/labels/canary/metadata", ("toy", None, "canary", "metadata")),
    ("/v1/models/toy/metadata", ("toy", None, None, "metadata")),
])
def test_status_path_grammar(path, groups):
    assert STATUS_PATH.match(path).groups() == groups


def test_version_rules():
    served = ModelVersion(7, -1)
    assert call_checks.check_served("m", served, None) == 7
    assert call_checks.check_served("m", served, 7) == 7
    with pytest.raises(NotFound, match=r"Servable not found for request: Specific\(m, 8\)"):
        call_checks.check_served("m", served, 8)
    assert call_checks.version_number(ModelVersion(-1, -1)) == 0
    assert call_checks.requested_version("m", None, "stable", {"stable": 7}) == 7
    with pytest.raises(InvalidArgument, match="Both model version"):
        call_checks.requested_version("m", 7, "stable", {"stable": 7})
    with pytest.raises(InvalidArgument, match="Unrecognized servable version label: canary"):
        call_checks.requested_version("m", None, "canary", {"stable": 7})


def test_tensor_proto_round_trip():
    from tensorflow.core.framework import tensor_pb2

    import tensorflow as tf

    from server.tfserving import tensor_proto

    for array in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[1, 2]], np.int64),
                  np.array([b"a", b"bc"], dtype=object), np.array([True, False])):
        proto = tensor_pb2.TensorProto()
        tensor_proto.from_numpy(array, proto)
        back = tf.make_ndarray(proto)
        assert back.tolist() == array.tolist()
        assert tensor_proto.to_numpy("t", tf.make_tensor_proto(array)).tolist() == array.tolist()
    typed = tensor_pb2.TensorProto(dtype=DT_FLOAT, float_val=[1.5])
    typed.tensor_shape.dim.add(size=2)
    assert tensor_proto.to_numpy("t", typed).tolist() == [1.5, 1.5]  # one value broadcasts
    assert tensor_proto.to_numpy("t", typed, max_bytes=8).tolist() == [1.5, 1.5]  # within the limit
    for dims in ((3,), (2**20, 2**20), (2**40, 2**40)):  # a tiny request may not build a huge tensor
        huge = tensor_pb2.TensorProto(dtype=DT_FLOAT, float_val=[1.0])
        for d in dims:
            huge.tensor_shape.dim.add(size=d)
        with pytest.raises(PayloadTooLarge, match=r"broadcast to shape .*\(max_request_bytes\)"):
            tensor_proto.to_numpy("t", huge, max_bytes=8)
    strings = tensor_pb2.TensorProto(dtype=DT_STRING, string_val=[b"a"])
    strings.tensor_shape.dim.add(size=2**40)
    with pytest.raises(PayloadTooLarge):
        tensor_proto.to_numpy("t", strings, max_bytes=1 << 20)
    typed.float_val.extend([2.0, 3.0])
    with pytest.raises(InvalidArgument, match="holds 2 values but 3 were given"):
        tensor_proto.to_numpy("t", typed)
    bad = tensor_pb2.TensorProto(dtype=DT_FLOAT, tensor_content=b"123")
    bad.tensor_shape.dim.add(size=1)
    with pytest.raises(InvalidArgument, match="tensor_content"):
        tensor_proto.to_numpy("t", bad)
