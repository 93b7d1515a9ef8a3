"""TF Serving REST JSON under hostile or large input: the run-at-a-time decoder of large bodies
gives exactly the arrays of the whole-body path; bad JSON is a bounded 400; limits; the decode
memory budget; body reading."""

from __future__ import annotations

import asyncio
import base64
import json
import random

import numpy as np
import pytest

from processor import request as call_checks
from processor.dtypes import DT_BOOL, DT_DOUBLE, DT_FLOAT, DT_INT32, DT_INT64, DT_STRING
from processor.errors import InvalidArgument, PayloadTooLarge, ProcessorError, SignatureNotFound, Unavailable
from processor.signature import Signature, TensorSpec
from server.http import body as body_mod
from server.http import json_stream, memory_budget
from server.tfserving import rest_json as tfs_json
from server.tfserving import rest_json_encode as tfs_json_encode
from server.tfserving import rest_json_inputs as tfs_json_inputs
from server.tfserving import rest_json_runs as tfs_json_runs

TOY = Signature("serving_default", {"x": TensorSpec("x", "x:0", DT_FLOAT, (-1, 1))}, {})
MULTI = Signature("serving_default", {
    "dense": TensorSpec("dense", "dense:0", DT_FLOAT, (-1, 2)),
    "ids": TensorSpec("ids", "ids:0", DT_INT64, (-1, 3)),
    "tokens": TensorSpec("tokens", "tokens:0", DT_STRING, (-1, 2)),
    "flag": TensorSpec("flag", "flag:0", DT_BOOL, (-1,)),
}, {})
TYPED = Signature("serving_default", {
    "i32": TensorSpec("i32", "i32:0", DT_INT32, (-1,)),
    "f64": TensorSpec("f64", "f64:0", DT_DOUBLE, (-1,)),
}, {})
MAX_MESSAGE = 1024


def short_runs(monkeypatch) -> None:
    """Runs of 64 bytes, elements of over 256 bytes split out (where the decoders read them)."""
    monkeypatch.setattr(tfs_json_runs, "CHUNK", 64)
    monkeypatch.setattr(tfs_json_inputs, "CHUNK", 64)
    monkeypatch.setattr(tfs_json_runs, "_BIG_RUN", 256)


@pytest.fixture
def tiny_runs(monkeypatch):
    """Every body takes the large-body path, with runs of 64 bytes and 37-byte scan blocks."""
    monkeypatch.setattr(tfs_json, "SMALL_BODY", 0)
    short_runs(monkeypatch)
    monkeypatch.setattr(json_stream, "BLOCK", 37)


def decode(body: bytes | str, sig: Signature, limits=tfs_json.Limits()):
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    request = tfs_json.parse_request(body, limits)
    if request.signature_name:
        call_checks.served_signature(request.signature_name, {sig.name: sig})
    return tfs_json.decode_request(request, sig)


def outcome(body, sig):
    """(format, {name: (dtype, shape, bytes or list)}) or (error type, message)."""
    try:
        arrays, fmt = decode(body, sig)
    except ProcessorError as exc:
        return type(exc).__name__, str(exc)
    return fmt, {k: (v.dtype, v.shape, v.tolist() if v.dtype == object else v.tobytes())
                 for k, v in arrays.items()}


def rows_of(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"dense": [rng.gauss(0, 1), rng.choice([1, 2.5, True])],
             "ids": [rng.randrange(-2**63, 2**63), i, -3],
             "tokens": [rng.choice(["a\\\"b,]", "é", "{x}", ""]),
                        {"b64": base64.b64encode(bytes([i % 256, 255])).decode()}],
             "flag": bool(i % 3)} for i in range(n)]


def columns_of(rows: list[dict]) -> dict:
    return {k: [r[k] for r in rows] for k in rows[0]}


SAME_CASES = [
    (json.dumps({"instances": rows_of(60)}), MULTI),
    (json.dumps({"signature_name": "serving_default", "inputs": columns_of(rows_of(60, 1))}), MULTI),
    (json.dumps({"instances": [[random.Random(2).gauss(0, 1) * 10 ** k] for k in range(-40, 40)]}), TOY),
    (json.dumps({"instances": [[1]] * 40 + [[2.5]] * 40}), TOY),  # ints then floats
    (json.dumps({"instances": [[2 ** 60 + 1]] * 40 + [[2.5]] * 40}), TOY),  # ints > 2**53 meet floats
    (json.dumps({"instances": [[2 ** 60 + 1]] * 80}), TOY),
    (json.dumps({"instances": [[-1]] * 40 + [[2 ** 63]] * 40}), TOY),  # int64 + uint64 -> float64
    (json.dumps({"instances": [[True]] * 40 + [[2]] * 40}), TOY),  # booleans among numbers
    (json.dumps({"instances": [[True]] * 80}), TOY),  # booleans only: refused
    (json.dumps({"instances": [[1]] * 40 + [[1, 2]] * 40}), TOY),  # ragged across runs
    (json.dumps({"instances": [[1]] * 40 + [["a"]] * 40}), TOY),
    (json.dumps({"instances": [[1]] * 40 + [[None]] * 40}), TOY),
    ('{"instances": [' + ",".join(["[NaN]"] * 30 + ["[1e400]"] * 30 + ["[-Infinity]", "[1.5]"] * 15) + "]}", TOY),
    (json.dumps({"inputs": [[float(i)] for i in range(200)]}), TOY),
    (json.dumps({"inputs": {"x": [[[float(i)] for i in range(200)]]}}), TOY),  # one big element
    (json.dumps({"instances": [{"x": [float(i) for i in range(200)]}]}), TOY),  # one big example
    (json.dumps({"instances": [{"x": [1.0]}] * 40 + [[1.0]]}), TOY),
    (json.dumps({"instances": [[1.0]] * 40 + [{"x": [1.0]}]}), TOY),
    (json.dumps({"instances": [{"x": [1.0]}] * 40 + [{"y": [1.0]}]}), TOY),
    (json.dumps({"instances": [{"x": [1.0]}] * 40 + [{"x": [1.0], "y": [1.0]}]}), TOY),
    (json.dumps({"inputs": {"i32": list(range(100)), "f64": [0.1 * i for i in range(100)]}}), TYPED),
    (json.dumps({"inputs": {"i32": list(range(100)) + [2 ** 31], "f64": [0.5]}}), TYPED),
    (json.dumps({"inputs": {"i32": [1] * 50 + [1.5] * 50, "f64": [0.5]}}), TYPED),
    (json.dumps({"inputs": {"i32": [True] * 100, "f64": [0.5]}}), TYPED),
    (json.dumps({"inputs": {"i32": [True] * 50 + [7] * 50, "f64": [0.5]}}), TYPED),
    (json.dumps({"inputs": {"flag": [True] * 50 + [1] * 50}}), MULTI),
    (json.dumps({"inputs": {"tokens": [["a", "b"]] * 50 + [[1, 2]]}}), MULTI),
    (json.dumps({"inputs": {"tokens": [["a", "b"]] * 50 + [["a"]]}}), MULTI),
    (json.dumps({"inputs": {"tokens": [["a", "b"]] * 50 + [[{"b64": "!!"}, "a"]]}}), MULTI),
    (json.dumps({"instances": [{"b64": base64.b64encode(b"\x00" * i).decode()} for i in range(60)]}),
     Signature("s", {"s": TensorSpec("s", "s:0", DT_STRING, (-1,))}, {})),
]


@pytest.mark.parametrize("body, sig", SAME_CASES, ids=[str(i) for i in range(len(SAME_CASES))])
def test_large_body_path_equals_whole_body_path(body, sig, monkeypatch):
    whole = outcome(body, sig)
    monkeypatch.setattr(tfs_json, "SMALL_BODY", 0)
    assert outcome(body, sig) == whole  # runs of 256 KiB: one run here
    short_runs(monkeypatch)
    monkeypatch.setattr(json_stream, "BLOCK", 37)
    assert outcome(body, sig) == whole


def test_many_runs_decode_exactly(tiny_runs):
    values = np.random.default_rng(0).normal(size=(3000, 1)) * 1e3
    body = json.dumps({"instances": [{"x": v} for v in values.tolist()]})
    arrays, fmt = decode(body, TOY)
    assert fmt == tfs_json.ROW
    np.testing.assert_array_equal(arrays["x"], values.astype(np.float32))


# --- the bad-input corpus -------------------------------------------------------------------------

HUGE = "s" * 1_000_000
BAD = [
    ('{"instances": [["\\udfff"]]}', MULTI, InvalidArgument, "'instances' holds plain values"),
    ('{"instances": [{"tokens": ["\\udfff", "a"], "dense": [1, 2], "ids": [1, 2, 3], "flag": true}]}',
     MULTI, InvalidArgument, "unpaired UTF-16 surrogate"),
    ('{"inputs": {"tokens": [["a", "\\udfff"]]}}', MULTI, InvalidArgument, "unpaired UTF-16 surrogate"),
    ('{"inputs": {"tokens": [["a", "\\ud800\\u0041"]]}}', MULTI, InvalidArgument, "unpaired UTF-16 surrogate"),
    ('{"inputs": {"\\udfff": [1]}}', MULTI, InvalidArgument, "unknown input"),
    ('{"signature_name": "\\udfff", "inputs": [[1]]}', TOY, SignatureNotFound, "not found."),
    ("[" * 100_000, TOY, InvalidArgument, "nesting deeper than 64"),
    ('{"a":' * 3000, TOY, InvalidArgument, "nesting deeper than 64"),
    ('{"inputs": ' + "[" * 70 + "1" + "]" * 70 + "}", TOY, InvalidArgument, "nesting deeper than 64"),
    (b'{"instances": [["\xff"]]}', MULTI, InvalidArgument, "not valid UTF-8"),
    (b'{"instances": [[1.0]]}\xc3', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": [[NaN]], "x": nan}', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": [[1.0]] "inputs": 1}', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": [[1.0],]}', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": [[1.0]]}}', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": [[1.0]}', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": [[1.0]]', TOY, InvalidArgument, "JSON Parse error"),
    ('{"instances": "abc"}', TOY, InvalidArgument, "must be a list"),
    ('{"instances": [["1.0"]]}', TOY, InvalidArgument, "expects numbers"),
    ('{"instances": [[{}]]}', TOY, InvalidArgument, "expects numbers"),
    ('{"instances": [[true]]}', TOY, InvalidArgument, "expects numbers"),
    ('{"inputs": {"ids": [[1, 2, NaN]]}}', MULTI, InvalidArgument, "expects integers"),
    ('{"inputs": {"flag": [null]}}', MULTI, InvalidArgument, "expects true/false"),
    ('{"inputs": {"tokens": [[1, 2]]}}', MULTI, InvalidArgument, "expects strings"),
    ('{"instances": [[1.0]], "signature_name": 7}', TOY, InvalidArgument, "must be a string"),
    ('{"instances": [[1.0]], "signature_name": "' + HUGE + '"}', TOY, SignatureNotFound, "not found."),
    ('{"instances": [{"' + HUGE + '": [1.0]}]}', TOY, InvalidArgument, "unknown input"),
    ('{"instances": [{"x": [1.0]}, {"' + HUGE + '": [1.0]}]}', TOY, InvalidArgument, "same inputs"),
    ('{"inputs": {"tokens": [[{"b64": "' + HUGE + '!"}, "a"]]}}', MULTI, InvalidArgument, "invalid base64"),
    ('"' + HUGE, TOY, InvalidArgument, "JSON Parse error"),
    ("{" + ",".join(f'"k{i}": 0' for i in range(5000)) + "}", TOY, InvalidArgument, ""),  # members: 4096 at most
    ("[1, 2]", TOY, InvalidArgument, "JSON Value is not an object"),
    ("   ", TOY, InvalidArgument, "JSON Parse error"),
]


@pytest.mark.parametrize("path", ["whole", "runs"])
@pytest.mark.parametrize("body, sig, error, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_bounded_client_error(body, sig, error, message, path, monkeypatch):
    if path == "runs":
        monkeypatch.setattr(tfs_json, "SMALL_BODY", 0)
        short_runs(monkeypatch)
    with pytest.raises(ProcessorError) as info:
        decode(body, sig)
    text = str(info.value)
    assert isinstance(info.value, error) and message in text, text[:2000]
    assert len(text) <= MAX_MESSAGE and text.isascii() and text.isprintable(), text[:2000]


def test_element_limit(tiny_runs):
    body = json.dumps({"instances": [[1.0]] * 200})
    with pytest.raises(PayloadTooLarge, match="json_max_elements"):
        decode(body, TOY, tfs_json.Limits(max_elements=199))
    assert decode(body, TOY, tfs_json.Limits(max_elements=200))[0]["x"].shape == (200, 1)


def test_element_limit_small_body():
    with pytest.raises(PayloadTooLarge, match="more than 2 tensor elements"):
        decode('{"inputs": [[1], [2], [3]]}', TOY, tfs_json.Limits(max_elements=2))


# --- responses ------------------------------------------------------------------------------------

@pytest.mark.parametrize("outputs", [
    {"y": np.arange(1000, dtype=np.float32).reshape(-1, 1) / 7},
    {"p": np.linspace(0, 1, 500), "label": np.array([b"a", b"\xff"] * 250, dtype=object)},
    {"y": np.array([[np.nan], [np.inf], [1.5]] * 300, np.float32)},
    {"y": np.zeros((0, 3), np.float32)},
    {"y": np.arange(2000, dtype=np.int64).reshape(2, 1000)},
])
@pytest.mark.parametrize("fmt", [tfs_json.ROW, tfs_json.COLUMNAR])
def test_response_in_runs_is_byte_identical(outputs, fmt, monkeypatch):
    def whole() -> bytes:  # the response as one dumps of the whole document
        columns = {name: tfs_json_encode._to_json(name, a) for name, a in outputs.items()}
        dumps = tfs_json_encode._fast_dumps if all(tfs_json_encode._finite(a) for a in outputs.values()) else tfs_json_encode._dumps
        if fmt == tfs_json.COLUMNAR:
            return dumps({"outputs": next(iter(columns.values())) if len(columns) == 1 else columns})
        names = list(columns)
        rows = columns[names[0]] if len(names) == 1 else [dict(zip(names, v)) for v in zip(*columns.values())]
        return dumps({"predictions": rows})

    expected = whole()
    monkeypatch.setattr(tfs_json_encode, "_ENCODE_RUN", 7)
    assert tfs_json_encode.encode_predict(outputs, fmt) == expected


# --- the decode memory budget and body reading ---------------------------------------------------

def test_memory_budget_admits_refuses_and_releases():
    budget = memory_budget.MemoryBudget(1000, factor=4)
    first = budget.hold()
    first.need(200)  # holds 800
    second = budget.hold()
    with pytest.raises(memory_budget.MemoryBusy, match="json_decode_memory_bytes") as info:
        second.need(100)
    assert isinstance(info.value, Unavailable) and info.value.retry_after >= 1
    with pytest.raises(PayloadTooLarge, match="never|whole decode budget"):
        second.need(300)  # 1200 > 1000: could never fit
    assert budget.used == 800
    first.release()
    with second:
        second.need(50)
        second.need(100)  # grows to 400
        assert budget.used == 400
    assert budget.used == 0 and budget.peak == 800
    assert memory_budget.MemoryBudget(0).hold().need(10 ** 12) is None  # 0: no budget


def test_a_large_body_is_parsed_whole_when_the_budget_holds_orjsons_peak():
    """json_stream.parse_whole: a body over SMALL_BODY streams only when a whole-body decode
    (WHOLE_FACTOR x the body) would exceed what json_decode_memory_bytes allows now."""
    whole_factor, factor = memory_budget.WHOLE_FACTOR, memory_budget.FACTOR
    size = json_stream.SMALL_BODY + 1
    assert json_stream.parse_whole(json_stream.SMALL_BODY, None)  # small: whole, always
    assert not json_stream.parse_whole(size, None)  # no request's hold: a run at a time
    with memory_budget.MemoryBudget(0).hold() as hold:  # no budget: nothing to hold the peak against
        assert not json_stream.parse_whole(size, hold)
    budget = memory_budget.MemoryBudget(size * (whole_factor + 4))
    with budget.hold() as hold:
        hold.need(size)  # as read_body holds it: 2 x
        assert json_stream.parse_whole(size, hold)
        assert hold.held == budget.used == size * whole_factor
        hold.charge(size)  # its arrays: counted inside the whole-body hold
        assert budget.used == size * whole_factor
        hold.charge(size * whole_factor)  # beyond it: charged
        assert budget.used == size * (factor + 1 + whole_factor)
    assert budget.used == 0
    with budget.hold() as other, budget.hold() as hold:  # another request holds the room: runs
        other.need(3 * size)
        hold.need(size)
        assert not json_stream.parse_whole(size, hold) and budget.used == 4 * factor * size
    alone_over = memory_budget.MemoryBudget(size * whole_factor - 1)
    with alone_over.hold() as hold:  # its peak alone is over the whole budget: runs, within its 2 x
        hold.need(size)
        assert not json_stream.parse_whole(size, hold) and alone_over.used == factor * size


def test_a_large_body_parsed_whole_gives_the_arrays_a_run_at_a_time_gives():
    from server.kserve import rest_json as v2_json
    from server.tfserving.rest_predict import tfs_inputs

    body = json.dumps({"instances": rows_of(2500)}).encode()
    assert len(body) > json_stream.SMALL_BODY
    whole, runs = tfs_inputs(body, whole=True), tfs_inputs(body, whole=False)
    assert whole.request.doc is None and runs.request.doc is not None  # parsed whole / indexed
    got, want = whole(MULTI), runs(MULTI)
    assert got.keys() == want.keys() and whole.format == runs.format == tfs_json.ROW
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    v2 = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [60000],
                                 "data": [0.5] * 60000}]}).encode()
    assert len(v2) > json_stream.SMALL_BODY
    assert v2_json.parse(v2, whole=True)["inputs"][0]["data"] == [0.5] * 60000  # a plain list
    assert not isinstance(v2_json.parse(v2, whole=False)["inputs"][0]["data"], list)  # pieces, a run at a time


@pytest.mark.parametrize("runs", [False, True])
def test_decoder_charges_its_arrays(runs, monkeypatch):
    if runs:
        monkeypatch.setattr(tfs_json, "SMALL_BODY", 0)
        monkeypatch.setattr(tfs_json_runs, "CHUNK", 64)
        monkeypatch.setattr(tfs_json_inputs, "CHUNK", 64)
    body = json.dumps({"instances": rows_of(100)}).encode()
    charged: list[int] = []
    arrays, _ = tfs_json.decode_request(tfs_json.parse_request(body), MULTI, charged.append)
    numeric = sum(a.nbytes for a in arrays.values())
    strings = sum(len(b) + 33 for b in arrays["tokens"].reshape(-1).tolist())
    assert sum(charged) == numeric + (strings if runs else 0)
    budget = memory_budget.MemoryBudget(len(body) * 2 + 1000, factor=2)
    with budget.hold() as hold:
        hold.need(len(body))
        with pytest.raises(PayloadTooLarge, match="json_decode_memory_bytes"):
            tfs_json.decode_request(tfs_json.parse_request(body), MULTI, hold.charge)


def _receiver(chunks: list[bytes]):
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}
    return receive, messages


def test_read_body_preallocates_and_takes_the_budget(monkeypatch):
    monkeypatch.setattr(body_mod, "_PREALLOCATE", 10)
    data = bytes(range(256)) * 10
    receive, _ = _receiver([data[:1000], data[1000:2000], data[2000:]])
    budget = memory_budget.MemoryBudget(100_000, factor=4)
    with budget.hold() as hold:
        got = asyncio.run(body_mod.read_body(receive, [(b"content-length", str(len(data)).encode())],
                                             1 << 20, hold))
        assert bytes(got) == data and budget.used == 4 * len(data)
    assert budget.used == 0
    receive, left = _receiver([data[:1000], data[1000:]])  # no Content-Length: held as it arrives
    busy = memory_budget.MemoryBudget(12_000, factor=4)
    busy.hold().need(1000)
    with pytest.raises(memory_budget.MemoryBusy), busy.hold() as hold:
        asyncio.run(body_mod.read_body(receive, [], 1 << 20, hold))
    assert busy.used == 4000  # the refused request's first chunk was given back
    receive, left = _receiver([data[:1000], data[1000:]])
    with pytest.raises(PayloadTooLarge, match="json_max_request_bytes"):
        asyncio.run(body_mod.read_body(receive, [(b"content-length", b"2560")], 2000, None,
                                       "json_max_request_bytes"))
    assert not left  # the refused body was read and dropped


def test_read_body_short_body_is_an_error(monkeypatch):
    monkeypatch.setattr(body_mod, "_PREALLOCATE", 10)
    receive, _ = _receiver([b"x" * 50])
    with pytest.raises(InvalidArgument, match="Content-Length says 100"):
        asyncio.run(body_mod.read_body(receive, [(b"content-length", b"100")], 1000))
