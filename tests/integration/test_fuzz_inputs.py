"""Bounded, derandomized fuzzing of the request paths against a real (toy) model (issue 16):
``Processor.process`` with mutated and generated PredictRequest bytes, and the TF Serving REST
JSON handler (``server.http.predict.tfs_predict``, what ``POST /v1/models/m:predict`` runs) with
generated and mutated JSON bodies.

Every answer must be 200 or a 4xx-class status (never a 5xx, never an exception out of the
handler), nothing may be logged at ERROR (an "internal error" log line), and the next good
request must still be answered correctly. Hypothesis runs with a fixed seed
(``derandomize=True``) and no example database, so every run tries the same few thousand
cases; the whole module takes seconds.
"""

from __future__ import annotations

import json
import logging
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings  # the dev extra; scripts/setup.sh installs it
from hypothesis import strategies as st

from conftest import model_config
from processor import codec
from processor.proto import predict_pb2

_FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])


def fuzz(examples: int) -> settings:
    """The fixed-seed settings with ``examples`` cases (about 3,500 in all in this module)."""
    return settings(_FUZZ, max_examples=examples)

CLIENT_ERRORS = {400, 404, 413}  # what a bad request may get (InvalidArgument, NotFound, too large)
GOOD_X = np.array([[1.0], [2.0], [-3.5]], np.float32)


class ErrorLog(logging.Handler):
    """Collects ERROR records of every logger (an internal error is logged at ERROR)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def error_log():
    handler = ErrorLog()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


# --- Processor.process -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy_processor(toy_model, error_log):
    from processor.processor import Processor

    processor = Processor.create("toy", json.dumps(model_config(toy_model)))
    yield processor
    processor.close()


def _good_request() -> bytes:
    return codec.encode_request({"x": GOOD_X})


def _assert_good_answer(processor) -> None:
    status, body = processor.process(_good_request())
    assert status == 200, body[:300]
    y = codec.decode_response(body)["y"]
    np.testing.assert_allclose(y, 0.5 * GOOD_X + 2, rtol=1e-6)


def _corpus() -> list[bytes]:
    x = GOOD_X
    return [
        _good_request(),
        codec.encode_request({"x": x}, ["y"]),
        codec.encode_request({"x:0": x[:1]}, ["y:0"], signature_name="serving_default"),
        codec.encode_request({"x": np.zeros((0, 1), np.float32)}),
        codec.encode_request({"x": np.arange(64, dtype=np.float32).reshape(64, 1)}),
    ]


CORPUS = _corpus()


@st.composite
def mutated(draw) -> bytes:
    """A valid request with 1-6 byte flips, insertions, deletions or varint-sized splices."""
    data = bytearray(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.integers(0, 4))
        pos = draw(st.integers(0, len(data)))
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == 1:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == 2:
            del data[pos:pos + draw(st.integers(1, 8))]
        elif op == 3:  # a huge varint (a length or a dimension) where a byte was
            data[pos:pos + 1] = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"
        else:  # truncate
            del data[pos:]
    return bytes(data)


DIMS = st.one_of(st.integers(-3, 4), st.sampled_from([2**31 - 1, 2**31, 2**40, 2**62, -2**63, 2**63 - 1]))


@st.composite
def generated(draw) -> bytes:
    """A PredictRequest built field by field: any dtype, shape, values, keys and output filter."""
    request = predict_pb2.PredictRequest()
    request.signature_name = draw(st.sampled_from(["", "serving_default", "other", "x" * 5000]))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["x", "x:0", "y", "", "X", "x" * 3000]) | st.text(max_size=8))
        proto = request.inputs[key]
        proto.dtype = draw(st.integers(0, 23))
        for dim in draw(st.lists(DIMS, max_size=4)):
            proto.array_shape.dim.append(dim)
        kind = draw(st.sampled_from(["float", "double", "int", "int64", "string", "bool", "none"]))
        n = draw(st.integers(0, 8))
        if kind == "float":
            proto.float_val.extend(draw(st.lists(st.floats(width=32), min_size=n, max_size=n)))
        elif kind == "double":
            proto.double_val.extend(draw(st.lists(st.floats(), min_size=n, max_size=n)))
        elif kind == "int":
            proto.int_val.extend(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n)))
        elif kind == "int64":
            proto.int64_val.extend(draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n)))
        elif kind == "string":
            proto.string_val.extend(draw(st.lists(st.binary(max_size=6), min_size=n, max_size=n)))
        elif kind == "bool":
            proto.bool_val.extend(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    request.output_filter.extend(draw(st.lists(st.sampled_from(["y", "y:0", "z", "", "x"]), max_size=3)))
    return request.SerializeToString()


def _check_process(processor, data: bytes) -> None:
    status, body = processor.process(data)  # never raises: that is its contract
    assert status == 200 or status in CLIENT_ERRORS, (status, body[:300], data[:80])
    if status == 200 and data:
        predict_pb2.PredictResponse().ParseFromString(body)
    else:
        assert isinstance(body, bytes) and body


@fuzz(1500)
@given(mutated())
@example(b"")
@example(b"\x00")
@example(b"\x12\xff\xff\xff\xff\x0f")  # an input entry claiming 4 GiB
@example(b"\x0a" + b"\xff" * 10)
@example(struct.pack("<B", 0x12) + b"\x80" * 20)
def test_process_survives_mutated_requests(toy_processor, data):
    _check_process(toy_processor, data)


@fuzz(700)
@given(generated() | st.binary(max_size=64))
def test_process_survives_generated_requests(toy_processor, data):
    _check_process(toy_processor, data)


def test_process_still_answers_correctly_after_the_fuzz(toy_processor, error_log):
    _assert_good_answer(toy_processor)
    assert toy_processor.model_info()["state"] == "ready"
    assert not error_log.records, [r.getMessage()[:300] for r in error_log.records[:5]]


# --- TF Serving REST JSON ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def runtime(toy_model, error_log):
    pytest.importorskip("fastapi")
    from server.settings import DeploymentConfig
    from server.runtime import ServingRuntime

    deployment = DeploymentConfig.from_dict(
        {"models": [{"name": "toy", "model_config": model_config(toy_model), "version_labels": {"stable": 1}}],
         "http_port": 0, "grpc_port": None})
    rt = ServingRuntime(deployment)
    rt.start_models()
    rt.wait_models(120)
    assert rt.ready, rt.states()
    yield rt
    rt.close()


def _tfs(rt, body: bytes, version=None, label=None, method="predict") -> tuple[int, bytes]:
    """What ``POST /v1/models/toy[...]:method`` answers, minus the socket: (status, body)."""
    from server.http.predict import error_reply
    from server.tfserving.rest_predict import tfs_predict

    try:
        return 200, tfs_predict(rt, "toy", version, label, method, body)
    except Exception as exc:  # mapped exactly as the HTTP route maps it
        reply = error_reply(exc)
        return reply.status, reply.body


def _check_tfs(rt, body: bytes, **kw) -> None:
    status, answer = _tfs(rt, body, **kw)
    assert status == 200 or status in CLIENT_ERRORS, (status, answer[:300], body[:120])
    doc = json.loads(answer)
    assert ("predictions" in doc or "outputs" in doc) if status == 200 else "error" in doc, answer[:300]


SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
           | st.sampled_from([1e308, -0.0, 2**64, -2**63 - 1, "", "x"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(["b64", "x", "y", "instances", "inputs"])
                                             | st.text(max_size=4), inner, max_size=3), max_leaves=24)
ROWS = st.lists(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=1), max_size=5)


@st.composite
def tfs_documents(draw) -> bytes:
    doc: dict = {}
    shape = draw(st.sampled_from(["instances", "inputs", "both", "neither"]))
    if shape in ("instances", "both"):
        doc["instances"] = draw(ROWS | JSON_VALUES | st.lists(st.fixed_dictionaries({"x": JSON_VALUES}), max_size=3))
    if shape in ("inputs", "both"):
        doc["inputs"] = draw(ROWS | JSON_VALUES | st.fixed_dictionaries({"x": ROWS | JSON_VALUES}))
    if draw(st.booleans()):
        doc["signature_name"] = draw(st.sampled_from(["serving_default", "", "nope"]) | JSON_VALUES)
    if draw(st.booleans()):
        doc[draw(st.text(max_size=5))] = draw(JSON_VALUES)
    return json.dumps(doc).encode()  # NaN / Infinity tokens included, as TF Serving accepts them


GOOD_JSON = [b'{"instances": [[1.0], [2.0]]}', b'{"inputs": {"x": [[1.5]]}}', b'{"instances": [{"x": [3]}]}',
             b'{"signature_name": "serving_default", "inputs": [[0.25], [NaN]]}']


@st.composite
def mutated_json(draw, corpus: list[bytes] = GOOD_JSON) -> bytes:
    """One of ``corpus`` with 1-4 byte edits, insertions of JSON-ish tokens or deletions."""
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.integers(0, 2))
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = draw(st.sampled_from(b'[]{}",:0123456789.eE-+ntfx\\\xff\x00'))
        elif op == 1:
            data[pos:pos] = draw(st.sampled_from([b"[", b"]", b"{", b'"', b"1e999", b"-", b"null", b"\xc3",
                                                  b"\xed\xa0\x80", b"\\ud800", b"9" * 40]))
        else:
            del data[pos:pos + draw(st.integers(1, 6))]
    return bytes(data)


NASTY_JSON = [
    b"", b" ", b"null", b"[]", b"1", b'"x"', b"\xff\xfe{}", b"\xef\xbb\xbf{}", b"{\x00}",
    b"[" * 100_000 + b"]" * 100_000,  # nested past any recursion limit
    b'{"instances": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}",
    b'{"instances": [[' + b"9" * 5000 + b"]]}",  # past Python's int digit limit
    b'{"inputs": {"x": [[1.0]], "x:0": [[2.0]]}}',
    b'{"instances": [{"b64": "!!"}]}', b'{"instances": [[{"b64": "AAAA"}]]}',
    b'{"instances": [[1.0], [2.0, 3.0]]}', b'{"instances": [["1"]]}',
    b'{"instances": [[1.0]], "inputs": [[1.0]]}', b'{"inputs": {"z": [[1.0]]}}',
    b'{"instances": "' + b"x" * 100_000 + b'"}',
    b'{"signature_name": "' + b"s" * 1_000_000 + b'", "instances": [[1.0]]}',
]


@fuzz(1200)
@given(tfs_documents() | mutated_json() | st.binary(max_size=48))
def test_tfs_rest_json_survives_fuzzing(runtime, body):
    _check_tfs(runtime, body)


@pytest.mark.parametrize("body", NASTY_JSON, ids=lambda b: repr(b[:24]))
def test_tfs_rest_json_bad_input_corpus(runtime, body):
    status, answer = _tfs(runtime, body)
    assert status in CLIENT_ERRORS, (status, answer[:300])
    message = json.loads(answer)["error"]
    assert message and len(message) <= 4096, len(message)  # clear, and never the whole input back
    _check_good_tfs(runtime)


@fuzz(150)
@given(st.one_of(st.none(), st.integers(-2**63, 2**63)), st.one_of(st.none(), st.text(max_size=6)),
       st.sampled_from(["predict", "classify", "regress"]))
def test_tfs_rest_version_label_and_method_fuzz(runtime, version, label, method):
    _check_tfs(runtime, GOOD_JSON[0], version=version, label=label, method=method)


def _check_good_tfs(rt) -> None:
    status, answer = _tfs(rt, b'{"instances": [[1.0], [2.0]]}')
    assert status == 200, answer[:300]
    assert json.loads(answer) == {"predictions": [[2.5], [3.0]]}


def test_tfs_still_answers_correctly_after_the_fuzz(runtime, error_log):
    _check_good_tfs(runtime)
    assert not error_log.records, [r.getMessage()[:300] for r in error_log.records[:5]]
