"""The native codec (processor._native through WireCodec) against the Python reference codec.

Every request is decoded both ways: the same feeds (dtype, shape, values; fingerprints for the
inputs the native path hashes) or the same exception type and message. Every response is
encoded both ways: the same bytes. The corpus holds valid requests of every dtype, hand-made
invalid ones and seeded mutations of valid ones (truncations, byte flips, insertions).
"""

from __future__ import annotations

import random

import ml_dtypes
import numpy as np
import pytest

from processor import codec, native
from processor.dtypes import DT_BFLOAT16, DT_COMPLEX64, DT_HALF
from processor.engine.string_hash import fingerprint64
from processor.signature import Signature, TensorSpec
from processor.wire_codec import WireCodec

pytestmark = pytest.mark.skipif(native.MODULE is None, reason="processor._native is not built")

NUMERIC = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
           9: np.int64, 10: np.bool_, 17: np.uint16}


def _signature() -> Signature:
    inputs = {f"in_{dt}": TensorSpec(f"in_{dt}", f"t_{dt}:0", dt, (-1, 2)) for dt in NUMERIC}
    inputs["ids"] = TensorSpec("ids", "ids:0", 9, (-1,))
    inputs["anyshape"] = TensorSpec("anyshape", "anyshape:0", 1, None)
    inputs["s"] = TensorSpec("s", "s:0", 7, (-1, 1))
    inputs["hashed"] = TensorSpec("hashed", "hashed:0", 7, (-1, 3))
    outputs = {"y": TensorSpec("y", "y:0", 1, (-1, 1)), "z": TensorSpec("z", "z_tensor:0", 9, None)}
    return Signature("serving_default", inputs, outputs)


SIG = _signature()
FAST = WireCodec(SIG, {"hashed"})


def _feeds(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    feeds = {}
    for dt, np_type in NUMERIC.items():
        if np_type is np.bool_:
            feeds[f"in_{dt}"] = rng.integers(0, 2, (batch, 2)).astype(bool)
        elif np.issubdtype(np_type, np.integer):
            info = np.iinfo(np_type)
            feeds[f"in_{dt}"] = rng.integers(info.min, info.max, (batch, 2), endpoint=True, dtype=np_type)
        else:
            feeds[f"in_{dt}"] = rng.standard_normal((batch, 2)).astype(np_type)
    feeds["ids"] = rng.integers(-2**63, 2**63 - 1, batch, dtype=np.int64)
    feeds["anyshape"] = rng.standard_normal(rng.integers(0, 3, rng.integers(0, 4))).astype(np.float32)
    words = [b"", b"a", b"\x00zero\x00", "héllo".encode(), bytes(range(256)), b"x" * 70]
    feeds["s"] = np.array([words[int(i)] for i in rng.integers(0, len(words), batch)],
                          dtype=object).reshape(batch, 1)
    feeds["hashed"] = np.array([[bytes(rng.integers(0, 256, int(rng.integers(0, 90)), dtype=np.uint8))
                                 for _ in range(3)] for _ in range(batch)], dtype=object).reshape(batch, 3)
    return feeds


def _valid_requests() -> list[bytes]:
    rng = np.random.default_rng(7)
    out = []
    for batch in (0, 1, 2, 5, 64, 300):
        feeds = _feeds(rng, batch)
        out.append(codec.encode_request(feeds))
        out.append(codec.encode_request({k: feeds[k] for k in reversed(list(feeds))}, ["z", "y:0"]))
        by_name = {SIG.inputs[k].name: v for k, v in feeds.items()}
        out.append(codec.encode_request(by_name, ["z_tensor:0"], signature_name="other"))
    # int64 varints of every length (1..10 bytes: the decoder reads up to 8 bytes at a time)
    edges = [v for k in range(10) for v in (2 ** (7 * k) - 1, 2 ** (7 * k), -(2 ** (7 * k)))]
    edges = np.array([v for v in edges if -2**63 <= v < 2**63] + [2**63 - 1, -2**63], np.int64)
    feeds = _feeds(rng, len(edges))
    feeds["ids"] = edges
    feeds["in_3"] = np.clip(edges, -2**31, 2**31 - 1).astype(np.int32).repeat(2).reshape(-1, 2)
    out.append(codec.encode_request(feeds))
    return out


def _outcome(decode, data):
    try:
        return "ok", decode(data)
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return "error", (type(exc), str(exc))


def _as_decoded(result) -> codec.DecodedRequest:
    feeds, keys, aliases = result
    return codec.DecodedRequest(feeds, tuple(zip(keys, aliases)))


def _assert_same(data: bytes) -> str:
    kind, want = _outcome(lambda d: codec.decode_request(d, SIG), data)
    got_kind, got = _outcome(lambda d: _as_decoded(FAST.decode(d)), data)
    assert got_kind == kind, (kind, want, got)
    if kind == "error":
        assert got == want
        return kind
    assert got.fetches == want.fetches
    assert set(got.feeds) == set(want.feeds)
    for alias, ref in want.feeds.items():
        value = got.feeds[alias]
        if alias in FAST.fingerprinted and value.dtype == np.uint64:  # else the reference served it
            ref = fingerprint64(ref)
        assert value.dtype == ref.dtype and value.shape == ref.shape, alias
        if ref.dtype == object:
            assert value.ravel().tolist() == ref.ravel().tolist(), alias
        else:
            np.testing.assert_array_equal(value, ref, err_msg=alias)
    return kind


@pytest.fixture(params=[False, True], ids=["portable", "pext"])
def varint_path(request):
    """Each varint decoder in turn (wire.h: the portable mask-and-shift one, BMI2's pext where
    the CPU runs it fast); the CPU's choice again afterwards."""
    chosen = native.MODULE.varint_pext()
    if native.MODULE.varint_pext(request.param) != request.param:
        pytest.skip("this CPU has no fast pext (BMI2), so the decoder never takes that path here")
    yield request.param
    native.MODULE.varint_pext(chosen)


def test_valid_requests_decode_natively_and_equal_the_reference(varint_path):
    for data in _valid_requests():
        assert native.MODULE.decode(FAST._plan, data) is not None  # the fast path took it
        assert _assert_same(data) == "ok"


def test_invalid_requests_give_the_reference_errors(varint_path):
    good = _valid_requests()[3]
    feeds = _feeds(np.random.default_rng(1), 2)
    cases = [
        b"\x00", b"\xff" * 5, good[:-1], good + b"\x0a", good + b"\x0a\x05\x0a\x01a",
        codec.encode_request({**feeds, "nope": np.zeros(1, np.float32)}),
        codec.encode_request({k: v for k, v in feeds.items() if k != "ids"}),
        codec.encode_request({**feeds, "ids": feeds["ids"].astype(np.int32)}),
        codec.encode_request({**feeds, "ids": np.zeros((2, 1), np.int64)}),
        codec.encode_request({**feeds, "in_1": np.zeros((2, 3), np.float32)}),
        codec.encode_request({**feeds, "ids:0": feeds["ids"]}),
        codec.encode_request(feeds, ["nope"]),
        codec.encode_request(feeds, [""]),
        codec.encode_request({**feeds, "hashed": np.zeros((2, 3), np.float32)}),
    ]
    # values out of range for the narrow int dtypes travel as int32 on the wire
    from processor.proto import predict_pb2
    for alias, bad in (("in_6", 300), ("in_4", -1), ("in_5", 70000), ("in_17", 65536)):
        request = predict_pb2.PredictRequest()
        request.ParseFromString(codec.encode_request(feeds))
        request.inputs[alias].int_val[0] = bad
        cases.append(request.SerializeToString())
    request = predict_pb2.PredictRequest()
    request.ParseFromString(codec.encode_request(feeds))
    request.inputs["in_1"].array_shape.dim[0] = -2
    cases.append(request.SerializeToString())
    request.inputs["in_1"].array_shape.dim[0] = 2
    del request.inputs["s"].string_val[-1]
    cases.append(request.SerializeToString())
    for data in cases:
        assert _assert_same(data) == "error", data[:40]


def test_fuzzed_requests_agree_with_the_reference(varint_path):
    rng = random.Random(1234)
    corpus = _valid_requests()[:9]
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        data = bytearray(rng.choice(corpus))
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            pos = rng.randrange(len(data) + 1)
            if op < 0.4 and data:
                data[min(pos, len(data) - 1)] = rng.randrange(256)
            elif op < 0.7:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
            else:
                del data[pos:pos + rng.randint(1, 8)]
        outcomes[_assert_same(bytes(data))] += 1
    assert outcomes["ok"] and outcomes["error"]  # the mutations reach both kinds of outcome


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _ids_entry(payload: bytes, count: int) -> bytes:
    """The PredictRequest field holding input "ids" (int64, shape [count]) with `payload` as its
    packed int64_val bytes, valid or not."""
    array = b"\x08\x09" + _len_field(2, _len_field(1, _varint(count))) + _len_field(7, payload)
    return _len_field(2, _len_field(1, b"ids") + _len_field(2, array))


def test_varint_payloads_of_every_length_and_malformed_ones(varint_path):
    """int64 payloads written byte by byte, so varints of 1 to 10 bytes and malformed ones sit at
    every offset from the 64-byte blocks the decoder reads at a time, with the payload last in the
    message (nothing readable past it) or not: the reference's values, or its outcome."""
    rng, pick = np.random.default_rng(11), random.Random(11)
    others = codec.encode_request({k: v for k, v in _feeds(rng, 3).items() if k != "ids"})
    taken = 0
    for case in range(300):
        count = int(rng.integers(0, 200))
        sizes = [pick.randint(1, 10) for _ in range(count)]  # bytes per varint
        values = [pick.randrange(1 << 7 * (n - 1) if n > 1 else 0, min(1 << 7 * n, 1 << 64)) for n in sizes]
        payload = bytearray(b"".join(_varint(v) for v in values))
        assert len(payload) == sum(sizes)
        kind = case % 6
        if kind == 1:  # an 11-byte varint
            at = pick.randint(0, len(payload))
            payload[at:at] = b"\xff" * 10 + b"\x01"
        elif kind == 2:  # a 10-byte varint whose 10th byte is over 1
            at = int(rng.integers(0, len(payload) + 1))
            payload[at:at] = b"\x80" * 9 + b"\x02"
        elif kind == 3:  # a run of continuation bytes longer than a block
            at = int(rng.integers(0, len(payload) + 1))
            payload[at:at] = b"\x81" * int(rng.integers(60, 140)) + b"\x01"
        elif kind == 4 and payload:  # the last varint cut short
            payload[-1] |= 0x80
        # the shape counts the malformed varint too, so only its bytes can make it invalid
        shape_count = count + (1 if kind in (1, 2, 3) else 0)
        if kind == 5:  # one value more or fewer than the shape says
            shape_count = max(count + pick.choice((-1, 1)), 0)
        entry = _ids_entry(bytes(payload), shape_count)
        for data in (others + entry, entry + others):
            outcome = _assert_same(data)
            if kind == 0:
                assert outcome == "ok" and native.MODULE.decode(FAST._plan, data) is not None
                taken += 1
    assert taken >= 100


def test_rare_dtypes_and_wire_forms_fall_back_to_the_reference():
    sig = Signature("s", {"h": TensorSpec("h", "h:0", DT_HALF, None),
                          "b": TensorSpec("b", "b:0", DT_BFLOAT16, None),
                          "c": TensorSpec("c", "c:0", DT_COMPLEX64, None)},
                    {"y": TensorSpec("y", "y:0", 1, None)})
    wire = WireCodec(sig)
    data = codec.encode_request({"h": np.array([1.5, -2], np.float16),
                                 "b": np.array([0.25], ml_dtypes.bfloat16),
                                 "c": np.array([1 + 2j], np.complex64)})
    assert native.MODULE.decode(wire._plan, data) is None
    got, want = _as_decoded(wire.decode(data)), codec.decode_request(data, sig)
    for alias in want.feeds:
        np.testing.assert_array_equal(got.feeds[alias], want.feeds[alias])


def _outputs(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    shapes = [(), (0,), (3,), (2, 1), (4, 0, 2), (2, 3)]
    out = []
    for shape in shapes:
        arrays = {}
        for dt, np_type in NUMERIC.items():
            arrays[f"o{dt}"] = _feeds(rng, 2)[f"in_{dt}"].ravel()[:1].repeat(int(np.prod(shape))).reshape(shape)
        arrays["f16"] = rng.standard_normal(shape).astype(np.float16)
        arrays["bf16"] = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
        arrays["c64"] = (rng.standard_normal(shape) + 1j).astype(np.complex64)
        arrays["str"] = np.array([b"ab", b""] * 6, dtype=object)[:int(np.prod(shape))].reshape(shape)
        arrays["strided"] = rng.standard_normal((4, 6)).astype(np.float32)[::2, ::3]
        for key in ("", "a", "aa", "ab", "abc", "B", "é", "z"):  # protobuf's map-key order
            arrays[key] = rng.standard_normal(shape).astype(np.float32)
        out.append(arrays)
    return out


def test_responses_are_byte_identical_to_the_reference():
    taken = 0
    for arrays in _outputs(np.random.default_rng(3)):
        for subset in (arrays, {k: arrays[k] for k in list(arrays)[:9]}):
            keys, arrays = tuple(subset), list(subset.values())
            assert FAST.encode(keys, arrays) == codec.encode_response(subset)
            taken += native.MODULE.encode(keys, arrays) is not None
    assert taken >= 6  # the numeric-only subsets are encoded natively
    one = np.zeros(2, np.float32)
    assert FAST.encode(("y", "y"), [one, one + 1]) == codec.encode_response({"y": one + 1})


def test_native_fingerprints_equal_the_reference():
    rng = np.random.default_rng(5)
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in [*range(0, 200), 255, 1000]]
    values += ["héllo", "8625b742"]
    array = np.array(values, dtype=object).reshape(-1, 2)
    np.testing.assert_array_equal(native.MODULE.fingerprint64(array), fingerprint64(array))
    assert native.MODULE.fingerprint64(np.array([1, 2], dtype=object)) is None  # reference raises
    assert native.MODULE.fingerprint64(np.array([b"a"])) is None  # 'S' arrays: the reference


def test_model_info_says_the_native_codec_serves():
    assert FAST.describe()["native"] is True
    assert FAST.describe()["fingerprinted_inputs"] == ["hashed"]
