"""The JSON edges' native parts (server.native_json) against their Python references.

Every value of a seeded corpus (nested lists of every kind of leaf: small and large integers,
integers past int64, floats of every range, NaN and infinities, booleans, strings, nulls,
objects; empty, ragged and deep lists) is decoded for every input dtype twice, with the native
part and with it switched off: the same array (dtype, shape, values) or the same error, over
TF Serving REST's reading and KServe v2's. Every output array is encoded both ways: the same
bytes for TF Serving's responses; for v2's, the same JSON values, and without the native part
the json module's bytes of the response as it was written before.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import orjson
import pytest

from processor import dtypes, native
from processor.signature import TensorSpec
from server import native_json
from server.kserve import open_inference as oip
from server.kserve import rest_routes as v2
from server.tfserving import rest_json as tfs_json
from server.tfserving import rest_json_encode as tfs_json_encode
from server.tfserving.rest_json_values import to_array

pytestmark = [pytest.mark.skipif(native.MODULE is None, reason="processor._native is not built"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # the reference's overflow casts

TFS_DTYPES = [dtypes.DT_FLOAT, dtypes.DT_DOUBLE, dtypes.DT_INT32, dtypes.DT_INT64, dtypes.DT_INT8,
              dtypes.DT_INT16, dtypes.DT_UINT8, dtypes.DT_UINT16, dtypes.DT_BOOL, dtypes.DT_HALF,
              dtypes.DT_BFLOAT16, dtypes.DT_COMPLEX64]
V2_DATATYPES = [name for name in oip.DATATYPES if name != "BYTES"]
# 2**60 + 2**36 + 1: float32 straight from int64 is not float32 through float64 (rounded twice)
INT_EDGES = [0, 1, -1, 127, 128, -129, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -2**31 - 1, 2**53 + 1,
             2**60 + 2**36 + 1, 2**63 - 1, -2**63, 2**63, 2**64 - 1, 2**64, -2**63 - 1, 2**70]
FLOAT_EDGES = [0.0, -0.0, 0.5, -1.5, 1e-7, 1e-5, 1e16, 3.4028234663852886e38, 3.5e38, 1e300, -1e300,
               5e-324, 1e-46, 2.0**53 + 2, float("nan"), float("inf"), float("-inf")]


def _leaf(rng: random.Random, kind: str):
    if kind == "int":
        return rng.choice(INT_EDGES) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if kind == "float":
        return rng.choice(FLOAT_EDGES) if rng.random() < 0.2 else rng.uniform(-1e3, 1e3)
    return rng.choice([True, False, "x", None, {"b64": "eA=="}, [], 7, 2.5])


def _nested(rng: random.Random, shape: tuple[int, ...], kinds: list[str]):
    if not shape:
        return _leaf(rng, rng.choice(kinds))
    return [_nested(rng, shape[1:], kinds) for _ in range(shape[0])]


def corpus(seed: int = 0, n: int = 400) -> list:
    rng = random.Random(seed)
    values: list = [[], [[]], [[1, 2], [3]], [1, [2]], [[1], 2], [True, 2], [2**53 + 1, 0.5], 5, 2.5,
                    [[[]]], [1] * 3, [[1.0, 2.0]] * 2, [{"b64": "eA=="}], ["a", 1]]
    deep: list = [1.5]
    for depth in range(70):
        deep = [deep]
        if depth in (62, 63, 64, 65):
            values.append(deep)
    for _ in range(n):
        shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        kinds = rng.choice([["int"], ["float"], ["int", "float"], ["int", "other"], ["float", "other"]])
        values.append(_nested(rng, shape, kinds))
    return values


def outcome(fn):
    """``fn()``'s array, or its error's type and message."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the error is the outcome compared
        return (type(exc).__name__, str(exc))


def same(got, want) -> bool:
    if isinstance(want, tuple):
        return got == want
    if want.dtype == object:
        return isinstance(got, np.ndarray) and got.dtype == object and got.tolist() == want.tolist()
    return (isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
            and got.tobytes() == want.tobytes())


@pytest.fixture
def without_native(monkeypatch):
    """A function that runs ``fn`` with the native parts switched off (the references alone)."""
    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(native_json, "_array", None)
            m.setattr(native_json, "_numbers", None)
            return fn()
    return run


def test_tf_serving_values_decode_as_the_reference_does(without_native):
    taken = 0
    for dt in TFS_DTYPES:
        spec = TensorSpec("x", "x:0", dt, None)
        for value in corpus(seed=dt):
            want = without_native(lambda: outcome(lambda: to_array(value, spec, "x")))
            got = outcome(lambda: to_array(value, spec, "x"))
            assert same(got, want), (dtypes.dtype_name(dt), value, got, want)
            taken += native_json.array(value, spec_dtype(dt)) is not None if spec_dtype(dt) else 0
    assert taken > 500  # the native part decoded most plain lists itself


def spec_dtype(dt: int) -> np.dtype | None:
    wire = dtypes.WIRE_TYPES.get(dt)
    return wire.numpy if wire else None


def test_v2_data_decodes_as_the_reference_does(without_native):
    rng = random.Random(7)
    taken = 0
    for datatype in V2_DATATYPES:
        for value in corpus(seed=len(datatype)):
            flat = _flatten_or_none(value) if isinstance(value, list) else None
            count = len(flat) if flat is not None else 1
            for shape in ((count,), (max(count + rng.choice([-1, 1]), 0),)):
                tensor = oip.InferInput("x", datatype, shape, data=value)
                want = without_native(lambda: outcome(lambda: oip.to_array(tensor)))
                got = outcome(lambda: oip.to_array(tensor))
                assert same(got, want), (datatype, shape, value, got, want)
                taken += native_json.array(value, oip.DATATYPES[datatype], shape[0]) is not None
    assert taken > 500


def _flatten_or_none(value: list) -> list | None:
    try:
        return oip._flatten("x", value)
    except Exception:  # noqa: BLE001
        return None


def arrays(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [np.array(0.5, np.float32), np.array(True), np.zeros((2, 0), np.float32), np.zeros((0, 3)),
           np.array([np.nan], np.float32), np.array([np.inf]), np.array([1.5], np.float16),
           np.array([1.5], ml_dtypes.bfloat16), np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2],
           np.array([1.5, 2.5], ">f8"), np.array([b"a"], object), np.array([1 + 2j], np.complex64)]
    for dtype in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                  np.uint32, np.uint64, np.bool_):
        for shape in ((), (1,), (3, 1), (2, 3, 2), (257,)):
            bits = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
            a = bits.view(dtype).reshape(shape) if dtype is not np.bool_ else (bits % 2).astype(bool).reshape(shape)
            if a.dtype.kind == "f":
                a = np.where(np.isfinite(a), a, 1.25).astype(dtype)
            out.append(a)
    out.append(rng.standard_normal((64, 4)).astype(np.float32))
    out.append((10.0 ** rng.integers(-30, 30, 512)).astype(np.float64))
    return out


def test_numbers_are_orjsons_bytes_or_not_taken():
    taken = 0
    for a in arrays():
        text = native_json.numbers(a)
        plain = (a.dtype.kind in "iub" or a.dtype in (np.float32, np.float64)) and a.dtype.isnative
        if text is None:
            assert (not plain or not a.flags.c_contiguous
                    or (a.dtype.kind == "f" and not np.isfinite(a).all())), a
            continue
        taken += 1
        assert plain and text == orjson.dumps(a.tolist()), a
    assert taken >= 55


@pytest.mark.parametrize("fmt", [tfs_json.ROW, tfs_json.COLUMNAR])
def test_tf_serving_responses_are_the_references_bytes(without_native, fmt):
    pool = arrays(1)
    rng = random.Random(3)
    cases = [{"y": a} for a in pool] + [
        {"a": np.zeros((2, 1), np.float32), "b": np.ones((2,), np.int64)},
        {"a": np.zeros((2, 1), np.float32), "b": np.array([np.nan, 1.0])},
        {"a": np.zeros((2, 1), np.float32), "b_bytes": np.array([b"\xff", b"x"], object)},
        {"\u00e9t\u00e9": np.ones((1, 2), np.float32), "q\"uote": np.ones((1,), np.int32)}]
    cases += [{f"o{i}": rng.choice(pool) for i in range(rng.randint(1, 3))} for _ in range(60)]
    for outputs in cases:
        want = without_native(lambda: outcome(lambda: bytes(tfs_json_encode.encode_predict(outputs, fmt))))
        got = outcome(lambda: bytes(tfs_json_encode.encode_predict(outputs, fmt)))
        assert got == want, outputs


def test_v2_responses_read_as_the_references(without_native):
    """The same JSON values as the reference's, and with the native part off, the json module's
    bytes of the response dict as the v2 route wrote it before the native part."""
    body = json.dumps({"id": "r\u00e9q-1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                                     "data": [1.0]}]}).encode()
    for outputs in [{"y": a} for a in arrays(2)] + [{"p": np.ones((2, 1), np.float32),
                                                   "ids": np.arange(2, dtype=np.int64)}]:
        rt = SimpleNamespace(dataplane=SimpleNamespace(
            predict=lambda call, o=outputs: SimpleNamespace(version_number=3, outputs=o)))

        def answer():
            reply = v2._infer(rt, "m\u00f6del", None, body, None, None, v2.BodyLimits(1 << 20))
            return reply.status, bytes(reply.body)

        want = without_native(lambda: outcome(answer))
        got = outcome(answer)
        if isinstance(want[1], str) or isinstance(want[0], str):  # an error: the same one
            assert got == want
            continue
        assert got[0] == want[0] and json.loads(got[1]) == json.loads(want[1])
        tensors = [{"name": k, "datatype": oip.datatype_of(a), "shape": list(a.shape),
                    "data": oip.json_data(k, a)} for k, a in outputs.items()]
        before = {"model_name": "m\u00f6del", "model_version": "3", "outputs": tensors, "id": "r\u00e9q-1"}
        assert want[1] == json.dumps(before, allow_nan=False).encode()


# --- whole TF Serving REST bodies read natively (native_json.scan_tfs) ------------------------------

def _signature(specs: dict[str, int]):
    from processor.signature import Signature

    return Signature("serving_default", {k: TensorSpec(k, f"{k}:0", dt, None) for k, dt in specs.items()},
                     {"y": TensorSpec("y", "y:0", dtypes.DT_FLOAT, None)})


SIGNATURES = [_signature({"a": dtypes.DT_FLOAT, "b": dtypes.DT_INT64}),
              _signature({"a": dtypes.DT_INT32, "b": dtypes.DT_DOUBLE, "c": dtypes.DT_UINT8}),
              _signature({"a": dtypes.DT_FLOAT}), _signature({"a": dtypes.DT_INT8}),
              _signature({"a": dtypes.DT_STRING, "b": dtypes.DT_BOOL})]


def bodies(seed: int = 0, n: int = 300) -> list[bytes]:
    """TF Serving REST predict bodies: plain ones of every form, and ones that are not plain or
    not valid JSON (each must be read as the reference reads it, or left to it)."""
    rng = random.Random(seed)
    values = [v for v in corpus(seed, n) if isinstance(v, list)]
    out = [b"", b"{}", b"[]", b'{"instances": []}', b'{"inputs": {}}', b'{"instances": [1, 2]} x',
           b'{"instances": [1, 2]', b'{"instances": [-0, 1E5, 1e-400, 01]}', b'{"instances": [1.]}',
           b'{"instances": [NaN]}', b'{"instances": [1e400]}', b'{"instances": [12345678901234567890]}',
           b'{"instances": [-9223372036854775808, 9223372036854775807]}', b'{"instances": [9223372036854775808]}',
           b'{"instances": [{"a": 1}, 2]}', b'{"instances": [2, {"a": 1}]}', b'{"instances": [{"a": 1}, {"b": 1}]}',
           b'{"instances": [{"a": 1, "a": 2}]}', b'{"instances": [{"a": 1}, {"a": 1, "b": 2}]}',
           b'{"instances": [1], "inputs": [1]}', b'{"instances": [1], "instances": [2]}',
           b'{"instances": [1], "signature_name": 5}', b'{"instances": [1], "signature_name": "s\\u00e9"}',
           b'{"instances": [1], "signature_name": "x", "signature_name": "y"}', b'{"instances": [1], "other": 1}',
           b'{"inputs": 5}', b'{"inputs": [[1, 2], [3]]}', b'{"inputs": {"a": [1], "a": [2]}}',
           b'{"inputs": {"\\u0061": [1]}}', b'{"inputs": {"\xc3\xa9": [1]}}', b'\xef\xbb\xbf{"instances": [1]}',
           b' \t\r\n{ "instances" : [ { "a" : [ 1 , 2.5 ] , "b" : [ 3 ] } ] } \n',
           b'{"instances": [{"a": [1, 2]}, {"a": [3]}]}', b'{"instances": [{"a": true}]}',
           b'{"instances": [{"a": "x"}]}', b'{"instances": [{"a": {"b64": "eA=="}}]}', b'{"instances": [{"a": null}]}',
           b'{"instances": [{"a": [1152921573326323713, 1], "b": [1]}]}',  # 2**60 + 2**36 + 1: see INT_EDGES
           b'{"inputs": {"a": [1152921573326323713, 0.5]}}',
           ("{\"inputs\": {\"a\": " + "[" * 40 + "1" + "]" * 40 + "}}").encode(),
           ("{\"inputs\": {\"a\": " + "[" * 31 + "1" + "]" * 31 + "}}").encode()]
    for _ in range(n):
        names = rng.sample(["a", "b", "c", "zz"], rng.randint(1, 3))
        value = [rng.choice(values) for _ in names]
        form = rng.choice(["rows", "columns", "bare-rows", "bare-columns"])
        if form == "rows":
            rows = rng.randint(1, 3)
            doc: dict = {"instances": [{k: (v[0] if isinstance(v, list) and v and rng.random() < 0.3 else v)
                                        for k, v in zip(names, value)} for _ in range(rows)]}
        elif form == "columns":
            doc = {"inputs": dict(zip(names, value))}
        elif form == "bare-rows":
            doc = {"instances": value[0]}
        else:
            doc = {"inputs": value[0]}
        if rng.random() < 0.3:
            doc["signature_name"] = rng.choice(["", "serving_default", "other"])
        text = json.dumps(doc, allow_nan=True)
        if rng.random() < 0.2:
            text = text.replace(", ", rng.choice([",", " ,\n ", "\t,"]))
        out.append(text.encode())
    return out


def test_tf_serving_bodies_read_natively_decode_as_the_reference_does(without_native, monkeypatch):
    from server.tfserving.rest_predict import tfs_inputs

    limits = tfs_json.Limits()
    taken = 0

    def decode(body, signature):
        inputs = tfs_inputs(body, limits)
        arrays = inputs(signature)
        return inputs.signature_name, inputs.format, arrays

    for signature in SIGNATURES:
        for body in bodies(seed=len(signature.inputs)):
            with monkeypatch.context() as m:
                m.setattr(native_json, "_scan_tfs", None)
                want = without_native(lambda: outcome(lambda: decode(body, signature)))
            got = outcome(lambda: decode(body, signature))
            if len(want) == 2:  # an error: the same one
                assert got == want, (body[:200], got, want)
                continue
            assert got[:2] == want[:2] and got[2].keys() == want[2].keys(), (body[:200], got, want)
            for key in want[2]:
                assert same(got[2][key], want[2][key]), (body[:200], key, got[2][key], want[2][key])
            scan = native_json.scan_tfs(body)
            taken += scan is not None and tfs_json.decode_scan(scan, signature) is not None
    assert taken > 60  # many: the corpus is mostly of bodies the reference must read
    plain = b'{"instances": [{"a": [1.5, 2], "b": [3]}, {"a": [4, 5], "b": [6]}], "signature_name": "serving_default"}'
    scan = native_json.scan_tfs(plain)
    assert scan.signature_name == "serving_default" and scan.names == ["a", "b"] and not scan.columnar
    arrays = tfs_json.decode_scan(scan, SIGNATURES[0])
    assert arrays["a"].tolist() == [[1.5, 2], [4, 5]] and arrays["a"].dtype == np.float32
    assert arrays["b"].tolist() == [[3], [6]] and arrays["b"].dtype == np.int64
