"""Fuzz tests of the native gRPC server (issue 50), beside the Python one.

Messages: random bytes on every method, and valid requests to the direct path's model with a
few bytes changed, through grpcio channels: the native server answers each with the Python
server's status code (one of the table's) and an answer that runs holds what Python's holds.

Frames: a raw client (``h2`` writes a valid call, the test then breaks it) sends each server the same
byte streams on fresh connections: gRPC messages whose 5-byte prefix lies (longer or shorter
than the data, the compressed flag without an encoding, two messages on a unary call), DATA cut
into many frames or sent after the stream ended, headers without a path or content type, an
unknown method, a stream reset mid-message, and the whole stream with random bytes flipped,
cut or inserted. What comes back is read frame by frame (``hyperframe``, ``hpack``): the call's
``grpc-status`` where the server answered one, a RST_STREAM or GOAWAY where it refused the
stream. Neither server may crash, every grpc-status must be one the status table names (or
UNIMPLEMENTED for a method nobody serves, CANCELLED for a stream the client reset, and gRPC
1.51's own UNKNOWN for a request that is not a gRPC call at all), and a plain Predict still
answers afterwards. (grpcio's aio server, the Python one, never answers a unary call whose
client half-closed without a whole message; the native one answers INVALID_ARGUMENT.)
(The servers and their fixtures: tests/e2e/test_grpc_native_server.py.)
"""

from __future__ import annotations

import random
import re
import socket
import struct

import grpc
import numpy as np
import pytest

from processor import codec

pytest.importorskip("server.grpc._native_grpc", reason="the native gRPC server is not built")
h2_connection = pytest.importorskip("h2.connection", reason="the dev extra installs h2")

import h2.config  # noqa: E402
from hpack import Decoder  # noqa: E402
from hyperframe.exceptions import InvalidFrameError  # noqa: E402
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame  # noqa: E402

from test_grpc_native_server import (  # noqa: E402,F401 - its servers (module fixtures), run here again
    PREDICT, TABLE_CODES, channels, deployment, dlrm, feeds, servers, tfs_request)

# --- messages ------------------------------------------------------------------------------

# methods (and the metadata they are called with) fuzzed with random bytes; admin methods are not
# (their UNAUTHENTICATED / PERMISSION_DENIED comes from the admin gate, not the table)
FUZZED = [(PREDICT, (("model-name", "b"),)), (PREDICT, (("model-name", "p"),)), (PREDICT, ()),
          ("/tensorflow.serving.PredictionService/Predict", ()),
          ("/tensorflow.serving.PredictionService/GetModelMetadata", ()),
          ("/tensorflow.serving.PredictionService/Classify", ()),
          ("/tensorflow.serving.ModelService/GetModelStatus", ()),
          ("/inference.GRPCInferenceService/ModelInfer", ()),
          ("/inference.GRPCInferenceService/ModelMetadata", ()),
          ("/inference.GRPCInferenceService/ModelReady", ()),
          ("/grpc.health.v1.Health/Check", ())]


def test_random_bytes_on_every_method(servers, channels):
    rng = random.Random(50)
    bodies = [bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 7, 64, 700, 5000]))) for _ in range(12)]
    good = codec.encode_request(feeds(2))
    bodies += [good[:n] for n in (1, 5, len(good) // 2, len(good) - 1)]  # cut messages
    bodies += [good[:10] + b"\xff" * 8 + good[18:]]
    for method, metadata in FUZZED:
        call = channels["native"].unary_unary(method)
        reference = channels["python"].unary_unary(method)
        for body in bodies:
            codes = []
            for fn in (call, reference):
                try:
                    fn(body, metadata=metadata)  # no deadline: "b" tries the direct path first
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as err:
                    codes.append(err.code())
                    details = err.details()
            assert codes[0] in TABLE_CODES, (method, body[:40], codes[0], details)
            if codes[1] == grpc.StatusCode.UNKNOWN:  # grpcio's answer to bytes the health service cannot parse
                assert codes[0] == grpc.StatusCode.INVALID_ARGUMENT, (method, body[:40], codes)
            else:
                assert codes[0] == codes[1], (method, body[:40], codes)
    servers["native"]._check_alive()
    assert channels["native"].unary_unary(PREDICT)(good, metadata=[("model-name", "b")], timeout=30)


TFS_PREDICT = "/tensorflow.serving.PredictionService/Predict"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def decoded(method: str, data: bytes) -> tuple[object, dict[str, np.ndarray]]:
    """A Predict-like answer: what it names beside its outputs, and the outputs."""
    if method == PREDICT:
        return None, codec.decode_response(data)
    if method == TFS_PREDICT:
        from tensorflow_serving.apis import predict_pb2

        from server.tfserving.tensor_proto import to_numpy

        response = predict_pb2.PredictResponse.FromString(data)
        return response.model_spec, {k: to_numpy(k, v) for k, v in response.outputs.items()}
    from processor.proto import grpc_predict_v2_pb2 as v2

    from server.kserve import open_inference as oip

    response = v2.ModelInferResponse.FromString(data)
    meta = (response.model_name, response.model_version, response.id,
            [(o.name, o.datatype, list(o.shape)) for o in response.outputs])
    return meta, {o.name: np.frombuffer(raw, oip.DATATYPES[o.datatype]).reshape(o.shape)
                  for o, raw in zip(response.outputs, response.raw_output_contents)}


def mutated(data: bytes, rng: random.Random, *, edits: int = 3, run: int = 6, start: int = 0) -> bytes:
    """``data`` with 1 to ``edits`` random edits past ``start``: a byte changed, up to ``run``
    bytes cut, or up to ``run`` random bytes inserted."""
    b = bytearray(data)
    for _ in range(rng.randint(1, edits)):
        at = rng.randrange(start, len(b))
        kind = rng.random()
        if kind < 0.6:
            b[at] = rng.randrange(256)
        elif kind < 0.8:
            del b[at:at + rng.randint(1, run)]
        else:
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, run)))
    return bytes(b)


def test_mutated_requests_on_the_direct_paths_methods(servers, channels):
    """Valid requests to the direct path's model with a few bytes changed: whatever the direct
    path takes or hands on, the native server answers with Python's status code (one of the
    table's), and an answer that runs holds what Python's holds."""
    pytest.importorskip("tensorflow_serving", reason="tensorflow-serving-api is installed by scripts/setup.sh")
    from processor.proto import grpc_predict_v2_pb2 as v2

    from server.kserve import open_inference as oip

    seeds = [(PREDICT, codec.encode_request(feeds(3)), (("model-name", "b"),)),
             (TFS_PREDICT, tfs_request("b", 3).SerializeToString(), ()),
             (TFS_PREDICT, tfs_request("b", 3, content=False).SerializeToString(), ())]
    infer = v2.ModelInferRequest(model_name="b", id="f")
    for key, array in feeds(3).items():
        infer.inputs.add(name=key, datatype=oip.datatype_of(array), shape=array.shape)
        infer.raw_input_contents.append(oip.raw_bytes(array))
    seeds.append((MODEL_INFER, infer.SerializeToString(), ()))
    rng = random.Random(51)
    for method, seed, metadata in seeds:
        ours, reference = channels["native"].unary_unary(method), channels["python"].unary_unary(method)
        for _ in range(40):
            body = mutated(seed, rng)
            outcome = []
            for fn in (ours, reference):
                try:
                    outcome.append((grpc.StatusCode.OK, fn(body, metadata=metadata)))
                except grpc.RpcError as err:
                    outcome.append((err.code(), err.details()))
            (code, got), (want_code, want) = outcome
            assert code in TABLE_CODES and code == want_code, (method, body[:60], outcome)
            if code == grpc.StatusCode.OK:
                (meta, arrays), (want_meta, want_arrays) = decoded(method, got), decoded(method, want)
                assert meta == want_meta and arrays.keys() == want_arrays.keys(), (method, body[:60])
                for key, array in want_arrays.items():
                    np.testing.assert_allclose(arrays[key], array, rtol=1e-5, atol=1e-6, equal_nan=True)
    servers["native"]._check_alive()


# --- frames --------------------------------------------------------------------------------

CODES = {code.value[0]: code for code in grpc.StatusCode}
# ours (the status table), a method nobody serves, and the answer to a stream the client reset
ALLOWED = TABLE_CODES | {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.CANCELLED}
# what gRPC's core answers by itself, before any handler, to a request that is not a gRPC call
# (gRPC 1.51, the native server's: UNKNOWN "Missing :te header", "Bad method header"; newer cores
# reset the stream instead)
CORE_UNKNOWN = re.compile(r"(Missing|Bad) :?[a-z-]+ header")


def call_bytes(path: str, messages: list[bytes], *, headers: list[tuple[str, str]] | None = None,
               end: bool = True, chunk: int | None = None) -> bytes:
    """The client's bytes of one unary call on stream 1: the preface and settings, HEADERS,
    ``messages`` as DATA (each already framed, in ``chunk``-byte frames), END_STREAM if ``end``."""
    conn = h2_connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, headers if headers is not None else [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers"), ("model-name", "b")])
    data = b"".join(messages)
    step = chunk or max(1, len(data))
    for at in range(0, len(data), step):
        conn.send_data(1, data[at:at + step])
    if end:
        conn.end_stream(1)
    return conn.data_to_send()


def grpc_message(body: bytes, *, flag: int = 0, length: int | None = None) -> bytes:
    return struct.pack(">BI", flag, len(body) if length is None else length) + body


def exchange(port: int, data: bytes, timeout: float = 1.5) -> dict:
    """Send ``data`` on a fresh connection and read until the server closes it, answers stream 1
    with trailers, resets it, or ``timeout`` passes. What came back: (grpc-status, grpc-message)
    pairs, RST_STREAM and GOAWAY error codes, whether the connection closed."""
    out = {"status": [], "rst": [], "goaway": [], "closed": False}
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:  # the server closed first (it may, on a broken preface)
            out["closed"] = True
            return out
        sock.settimeout(timeout)
        decoder = Decoder()
        while True:
            try:
                got = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                out["closed"] = True
                break
            if not got:
                out["closed"] = True
                break
            received += got
            received, done = _read_frames(received, decoder, out)
            if done:
                break
    return out


def _read_frames(buf: bytes, decoder: Decoder, out: dict) -> tuple[bytes, bool]:
    done = False
    while len(buf) >= 9:
        try:
            frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
        except InvalidFrameError:  # a frame type hyperframe does not know: skip it whole
            length = int.from_bytes(buf[:3], "big")
            frame = None
        if len(buf) < 9 + length:
            break
        body, buf = buf[9:9 + length], buf[9 + length:]
        if frame is None:
            continue
        frame.parse_body(memoryview(body))
        if isinstance(frame, HeadersFrame):
            fields = {str(name): str(value) for name, value in decoder.decode(frame.data)}
            if "grpc-status" in fields:
                out["status"].append((CODES[int(fields["grpc-status"])], fields.get("grpc-message", "")))
            done = done or ("END_STREAM" in frame.flags and frame.stream_id == 1)
        elif isinstance(frame, RstStreamFrame):
            out["rst"].append(frame.error_code)
            done = done or frame.stream_id == 1
        elif isinstance(frame, GoAwayFrame):
            out["goaway"].append(frame.error_code)
    return buf, done


def cases() -> list[tuple[str, bytes]]:
    good = codec.encode_request(feeds(2))
    framed = grpc_message(good)
    made = [
        ("plain", call_bytes(PREDICT, [framed])),
        ("prefix longer than the data", call_bytes(PREDICT, [grpc_message(good, length=len(good) + 100)])),
        ("prefix shorter than the data", call_bytes(PREDICT, [grpc_message(good, length=len(good) - 7)])),
        ("prefix of 4 GiB", call_bytes(PREDICT, [grpc_message(good, length=0xFFFFFFFF)])),
        ("compressed flag, no encoding", call_bytes(PREDICT, [grpc_message(good, flag=1)])),
        ("flag byte 7", call_bytes(PREDICT, [grpc_message(good, flag=7)])),
        ("two messages on a unary call", call_bytes(PREDICT, [framed, framed])),
        ("an empty message", call_bytes(PREDICT, [grpc_message(b"")])),
        ("no message", call_bytes(PREDICT, [])),
        ("half a prefix", call_bytes(PREDICT, [framed[:3]])),
        ("one-byte DATA frames", call_bytes(PREDICT, [framed], chunk=1)),
        ("no END_STREAM", call_bytes(PREDICT, [framed], end=False)),
        ("an unknown method", call_bytes("/x.Y/Z", [framed])),
        ("a TF Serving Predict of our bytes", call_bytes("/tensorflow.serving.PredictionService/Predict", [framed])),
        ("a v2 ModelInfer of our bytes", call_bytes("/inference.GRPCInferenceService/ModelInfer", [framed])),
        ("no content-type", call_bytes(PREDICT, [framed], headers=[
            (":method", "POST"), (":scheme", "http"), (":path", PREDICT), (":authority", "localhost")])),
        ("GET", call_bytes(PREDICT, [framed], headers=[
            (":method", "GET"), (":scheme", "http"), (":path", PREDICT), (":authority", "localhost"),
            ("content-type", "application/grpc")])),
    ]
    plain = made[0][1]
    preface = len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    made += [
        ("DATA after END_STREAM", plain + struct.pack(">I", len(framed))[1:] + b"\x00\x01" + struct.pack(">I", 1) + framed),
        ("RST_STREAM mid-message", call_bytes(PREDICT, [framed[:20]], end=False) + b"\x00\x00\x04\x03\x00\x00\x00\x00\x01"
         + b"\x00\x00\x00\x08"),
        ("an unknown frame type", plain[:preface] + b"\x00\x00\x03\xee\x00\x00\x00\x00\x00abc" + plain[preface:]),
        ("a frame on stream 0 as DATA", plain[:preface] + b"\x00\x00\x02\x00\x00\x00\x00\x00\x00hi" + plain[preface:]),
        ("a frame length over the limit", plain[:preface] + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01"),
        ("cut inside the HEADERS", plain[:preface + 30]),
        ("a broken preface", b"PRI * HTTP/1.1\r\n\r\n" + plain[preface:]),
    ]
    rng = random.Random(50)
    made += [(f"mutated {i}", mutated(plain, rng, edits=4, run=9, start=preface)) for i in range(40)]
    return made


def test_fuzzed_frames_are_refused_or_answered_with_the_tables_codes(servers):
    plain_answers = {}
    for case, data in cases():
        for name, proc in servers.items():
            outcome = exchange(proc.grpc_port, data)
            for code, message in outcome["status"]:
                assert code in ALLOWED or (code == grpc.StatusCode.UNKNOWN and CORE_UNKNOWN.fullmatch(message)), \
                    (name, case, outcome)
            if case == "plain":
                plain_answers[name] = [code for code, _ in outcome["status"]]
            proc._check_alive()  # no crash
    assert plain_answers == {"python": [grpc.StatusCode.OK], "native": [grpc.StatusCode.OK]}, plain_answers
    body = codec.encode_request(feeds(2))
    for proc in servers.values():
        with grpc.insecure_channel(proc.grpc_target) as channel:
            assert channel.unary_unary(PREDICT)(body, metadata=[("model-name", "b")], timeout=30)
