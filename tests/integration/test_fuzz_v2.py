"""Bounded, derandomized fuzzing of the KServe v2 decoders and the version paths (issue 32),
against a real (toy) model: the REST infer handler (``server.kserve.rest_routes.infer_http``, what ``POST
/v2/models/toy[/versions/v]/infer`` runs) with generated and mutated JSON and binary-extension
bodies, large bodies included (the run-at-a-time decoder), and the gRPC
``inference.GRPCInferenceService`` of a real grpc server on a loopback port with generated,
mutated and random message bytes; the version texts on every path.

Every answer must be 200 or a 4xx-class status (INVALID_ARGUMENT / NOT_FOUND / RESOURCE_EXHAUSTED
on gRPC), with a bounded message; nothing is logged at ERROR; the next good request is answered
exactly (see :mod:`test_fuzz_inputs` for the settings).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_fuzz_inputs import CLIENT_ERRORS, error_log, fuzz, mutated_json, runtime  # noqa: F401 - the fixtures

grpc = pytest.importorskip("grpc")
from processor.proto import grpc_predict_v2_pb2 as pb  # noqa: E402

MAX_MESSAGE = 2048
GOOD_X = [[1.0], [2.0], [-3.5]]
GOOD_Y = [2.5, 3.0, 0.25]


@pytest.fixture(scope="module")
def grpc_infer(runtime):
    from server.app import PROTOCOLS
    from server.grpc.server import create_grpc_server

    server, port, health = create_grpc_server(runtime, "127.0.0.1", 0, protocols=PROTOCOLS)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    calls = {name: channel.unary_unary(f"/inference.GRPCInferenceService/{name}")
             for name in ("ModelInfer", "ModelReady", "ModelMetadata", "ServerLive")}
    yield calls
    channel.close()
    health.shutdown()
    server.stop(None)


# --- REST ---------------------------------------------------------------------------------------

def _rest(rt, body: bytes, header_length: str | None = None, version: str | None = None) -> tuple[int, bytes]:
    """What ``POST /v2/models/toy[/versions/v]/infer`` answers, minus the socket."""
    from server.http.predict import error_reply
    from server.kserve.rest_routes import infer_http

    try:
        reply = infer_http(rt, "toy", version, bytearray(body), header_length, None)
    except Exception as exc:  # mapped exactly as the route maps it
        reply = error_reply(exc)
    return reply.status, bytes(reply.body)


def _check_rest(rt, body: bytes, header_length: str | None = None, version: str | None = None) -> None:
    status, answer = _rest(rt, body, header_length, version)
    assert status == 200 or status in CLIENT_ERRORS, (status, answer[:300], body[:120])
    if status != 200:
        assert len(answer) <= MAX_MESSAGE and "error" in json.loads(answer), answer[:300]
    elif header_length is None and b'"binary_data_output": true' not in body:
        json.loads(answer, parse_constant=lambda token: pytest.fail(f"bare {token} in a JSON response"))


def _good_rest(rt) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 1], "data": GOOD_X}]}).encode()
    status, answer = _rest(rt, body)
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"][0]["data"] == GOOD_Y


DATATYPES = st.sampled_from(["FP32", "FP64", "FP16", "BF16", "INT8", "INT32", "INT64", "UINT64", "BOOL", "BYTES",
                             "", "fp32", "X" * 300])
DIMS = st.one_of(st.integers(-2, 4), st.sampled_from([2**31, 2**62, 2**63 - 1, 2**63, 10**30, True]))
SHAPES = st.lists(DIMS, max_size=4) | st.just([0] * 70) | st.sampled_from([[3, 1], [1, 1], [0, 1]])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
           | st.sampled_from([1e39, -1e300, 2**64, float("nan"), float("inf")]))
DATA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5), max_leaves=12)
NAMES = st.sampled_from(["x", "y", "", "x:0", "n" * 5000]) | st.text(max_size=4)


@st.composite
def v2_documents(draw) -> bytes:
    doc: dict = {}
    if draw(st.integers(0, 9)):
        tensors = []
        for _ in range(draw(st.integers(0, 3))):
            tensor = {"name": draw(NAMES), "datatype": draw(DATATYPES), "shape": draw(SHAPES)}
            if draw(st.integers(0, 5)):
                tensor["data"] = draw(DATA | st.just(GOOD_X))
            if draw(st.integers(0, 5)) == 0:
                tensor["parameters"] = draw(st.just({"binary_data_size": 0}) | DATA)
            tensors.append(tensor)
        doc["inputs"] = tensors
    else:
        doc["inputs"] = draw(DATA)
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": NAMES}), max_size=3) | DATA)
    if draw(st.booleans()):
        doc["parameters"] = draw(st.just({"binary_data_output": True}) | DATA)
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=6) | DATA)
    return json.dumps(doc).encode()


GOOD_V2 = [
    json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 1], "data": GOOD_X}]}).encode(),
    json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}],
                "outputs": [{"name": "y"}], "id": "r"}).encode(),
]


@fuzz(700)
@given(v2_documents() | mutated_json(GOOD_V2) | st.binary(max_size=48))
@example(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 4611686018427387904], "data": []}]}')
@example(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1], "data": [NaN, 1]}]}')
@example(b'{"inputs": [{"name": "x", "datatype": "FP16", "shape": [1, 1], "data": [1e300]}]}')
def test_v2_rest_json_survives_fuzzing(runtime, body):
    _check_rest(runtime, body)


@st.composite
def binary_bodies(draw) -> tuple[bytes, str]:
    blobs, inputs = [], []
    for _ in range(draw(st.integers(1, 2))):
        datatype = draw(DATATYPES)
        blob = draw(st.binary(max_size=24) | st.sampled_from([
            np.array(GOOD_X, np.float32).tobytes(), struct.pack("<I", 0) * 1000, b"\x02", struct.pack("<I", 2**32 - 1)]))
        size = draw(st.sampled_from([len(blob), len(blob) + 1, -1, 0]))
        inputs.append({"name": draw(NAMES), "datatype": datatype, "shape": draw(SHAPES),
                       "parameters": {"binary_data_size": size}})
        blobs.append(blob)
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": draw(st.booleans())}}).encode()
    length = draw(st.sampled_from([str(len(header)), str(len(header) + 1), "-1", "x", "9" * 30, "0"]))
    return header + b"".join(blobs), length


@fuzz(500)
@given(binary_bodies())
def test_v2_rest_binary_survives_fuzzing(runtime, case):
    body, length = case
    _check_rest(runtime, body, length)


@fuzz(8)
@given(st.integers(70_000, 90_000), st.sampled_from(["ok", "string", "short", "long", "nested", "ragged"]))
def test_v2_rest_large_json_bodies(runtime, n, flaw):
    """Bodies over 256 KiB take the run-at-a-time decoder: exact when valid, 4xx when not."""
    x = np.linspace(-8, 8, n, dtype=np.float32)
    data = x.reshape(n, 1).tolist() if flaw in ("nested", "ragged") else x.tolist()
    if flaw == "ragged":
        data[n // 2] = [1.0, 2.0]
    if flaw == "string":
        data[-1] = "x"
    shape = [n + (1 if flaw == "short" else -1 if flaw == "long" else 0), 1]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}).encode()
    status, answer = _rest(runtime, body)
    if flaw in ("ok", "nested"):
        assert status == 200, answer[:300]
        np.testing.assert_array_equal(np.array(json.loads(answer)["outputs"][0]["data"], np.float32), 0.5 * x + 2)
    elif flaw == "ragged":  # flattened, as the small-body path reads it: n + 1 elements for n
        assert status == 400, answer[:300]
    else:
        assert status == 400 and len(answer) <= MAX_MESSAGE, answer[:300]


VERSIONS = (st.text(max_size=6) | st.sampled_from(["1", "0", "01", "²", "³", "٣", "9" * 19, "9" * 20, "9" * 5000,
                                                   "9223372036854775807", "9223372036854775808", "-1", " 1"]))


@fuzz(200)
@given(VERSIONS)
def test_version_texts_on_every_path(runtime, grpc_infer, version):
    """v2 REST infer, TF Serving REST predict (what the URL's version becomes), v2 gRPC:
    a malformed version is 400 / INVALID_ARGUMENT, another one 404 / NOT_FOUND, 1 is served."""
    from processor.errors import ProcessorError
    from processor.request import parse_version
    from server.tfserving.rest_predict import tfs_predict

    _check_rest(runtime, GOOD_V2[0], version=version)
    try:
        wanted = parse_version(version)
    except ProcessorError as exc:
        assert exc.edge.http == 400 and len(str(exc)) <= 400
    else:
        assert version.isascii() and version.isdigit() and wanted < 2**63
        try:
            tfs_predict(runtime, "toy", wanted, None, "predict", b'{"instances": [[1.0]]}')
        except ProcessorError as exc:
            assert exc.edge.http == 404 and wanted != 1
    for name, message in (("ModelReady", pb.ModelReadyRequest(name="toy", version=version)),
                          ("ModelMetadata", pb.ModelMetadataRequest(name="toy", version=version))):
        _check_grpc(grpc_infer[name], message.SerializeToString())


# --- gRPC ---------------------------------------------------------------------------------------

GRPC_CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}


def _check_grpc(call, data: bytes) -> None:
    try:
        call(data, timeout=30)
    except grpc.RpcError as err:
        assert err.code().name in GRPC_CLIENT_ERRORS, (err.code(), err.details()[:300], data[:80])
        assert len(err.details()) <= 4200


def _good_grpc(grpc_infer) -> None:
    request = pb.ModelInferRequest(model_name="toy", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[3, 1], contents=pb.InferTensorContents(fp32_contents=sum(GOOD_X, [])))])
    response = pb.ModelInferResponse.FromString(grpc_infer["ModelInfer"](request.SerializeToString(), timeout=30))
    assert np.frombuffer(response.raw_output_contents[0], "<f4").tolist() == GOOD_Y


CONTENTS = ["fp32_contents", "fp64_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
            "bool_contents", "bytes_contents"]


@st.composite
def infer_messages(draw) -> bytes:
    request = pb.ModelInferRequest(model_name=draw(st.sampled_from(["toy", "", "nope", "t" * 20_000])),
                                   model_version=draw(VERSIONS | st.just("")), id=draw(st.text(max_size=4)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 2))):
        tensor = request.inputs.add(name=draw(NAMES), datatype=draw(DATATYPES),
                                    shape=draw(st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(0, 4), max_size=4)))
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=24)))
        else:
            field = draw(st.sampled_from(CONTENTS))
            n = draw(st.integers(0, 6))
            values = {"fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
                      "int_contents": st.integers(-2**31, 2**31 - 1), "int64_contents": st.integers(-2**63, 2**63 - 1),
                      "uint_contents": st.integers(0, 2**32 - 1), "uint64_contents": st.integers(0, 2**64 - 1),
                      "bool_contents": st.booleans(), "bytes_contents": st.binary(max_size=4)}[field]
            getattr(tensor.contents, field).extend(draw(st.lists(values, min_size=n, max_size=n)))
    for name in draw(st.lists(NAMES, max_size=2)):
        request.outputs.add(name=name)
    return request.SerializeToString()


@st.composite
def mutated_messages(draw) -> bytes:
    data = bytearray(draw(infer_messages()))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.integers(0, 2))
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == 1:
            data[pos:pos] = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"
        else:
            del data[pos:]
    return bytes(data)


@fuzz(500)
@given(infer_messages() | mutated_messages() | st.binary(max_size=48))
@example(b"\xff\xff\xff\xff")
def test_v2_grpc_survives_fuzzing(grpc_infer, data):
    _check_grpc(grpc_infer["ModelInfer"], data)


@fuzz(100)
@given(st.binary(max_size=32))
def test_v2_grpc_other_methods_survive_random_bytes(grpc_infer, data):
    for name in ("ModelReady", "ModelMetadata", "ServerLive"):
        _check_grpc(grpc_infer[name], data)


def test_v2_still_answers_correctly_after_the_fuzz(runtime, grpc_infer, error_log):
    _good_rest(runtime)
    _good_grpc(grpc_infer)
    assert not error_log.records, [r.getMessage()[:300] for r in error_log.records[:5]]
