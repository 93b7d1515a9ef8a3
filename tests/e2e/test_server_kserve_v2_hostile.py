"""The Open Inference Protocol (KServe v2) and the version paths under hostile input (issue 32),
against a real server (``python -m server`` on loopback ports) with real clients: tritonclient
(HTTP and gRPC), raw gRPC calls and plain HTTP.

Every bad request is answered with a 4xx / INVALID_ARGUMENT / NOT_FOUND and a bounded message,
nothing is logged as an internal error (nor a numpy warning), and the next valid request is
answered exactly. Models: the toy y = 0.5x + 2 (TensorFlow), the demo CTR model (ONNX Runtime;
BYTES, INT64 and FP32 inputs) and three small TF2 models of the odd datatypes: ``logic`` (BOOL
-> logical_not), ``echo`` (BYTES -> the same bytes) and ``half`` (BF16 -> 2 x value).
"""

from __future__ import annotations

import gzip
import http.client
import json
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import model_config
from test_server_json_limits import reset_peak, status_kb

tritonclient = pytest.importorskip("tritonclient", reason="tritonclient is a dev dependency (scripts/setup.sh)")
import grpc  # noqa: E402
import ml_dtypes  # noqa: E402
import tritonclient.grpc as tgrpc  # noqa: E402
import tritonclient.http as thttp  # noqa: E402

from processor.proto import grpc_predict_v2_pb2 as pb  # noqa: E402

MB = 1 << 20
BUDGET = 320 * MB  # json_decode_memory_bytes: four 32 MB bodies (2 x body each) fit
MAX_MESSAGE = 1024  # bytes of an error body / characters of a gRPC error message
X = [[1.0], [2.0], [-3.5]]
Y = [[2.5], [3.0], [0.25]]  # 0.5 x + 2, exact in float32


# --- models and server --------------------------------------------------------------------------

def _export(out_dir: Path, make):
    """A TF2 SavedModel of ``make(1)`` and checkpoint step 1 of ``make(2)`` (the demo layout)."""
    import tensorflow as tf

    from demo.checkpoint_publish import publish_checkpoint
    from demo.layout import prepare_out_dir, read_model_paths

    paths = prepare_out_dir(out_dir)
    module = make(1)
    tf.saved_model.save(module, str(paths.savedmodel_dir), signatures={"serving_default": module.serve})
    publish_checkpoint(paths.run_dir, 1, tf.train.Checkpoint(make(2)).write)
    return read_model_paths(out_dir)


def _odd_models(root: Path) -> dict:
    import tensorflow as tf

    def module(spec, output: str, fn):
        class Module(tf.Module):
            def __init__(self, seed: int) -> None:
                super().__init__()
                self.k = tf.Variable(float(seed))  # 2 in the checkpoint served

            @tf.function(input_signature=[spec])
            def serve(self, value):
                return {output: fn(self, value)}
        return Module

    made = {"logic": module(tf.TensorSpec([None], tf.bool, name="flag"), "not", lambda m, v: tf.logical_not(v)),
            "echo": module(tf.TensorSpec([None], tf.string, name="word"), "same", lambda m, v: tf.identity(v)),
            "half": module(tf.TensorSpec([None], tf.bfloat16, name="v"), "twice",
                           lambda m, v: v * tf.cast(m.k, tf.bfloat16))}
    return {name: _export(root / name, cls) for name, cls in made.items()}


@pytest.fixture(scope="module")
def server(toy_model, ctr_model_small, tmp_path_factory):
    from tools.server_process import ServerProcess

    odd = _odd_models(tmp_path_factory.mktemp("odd"))
    models = {"toy": model_config(toy_model), "demo": model_config(ctr_model_small, backend="onnxruntime"),
              **{n: model_config(p, backend="tensorflow") for n, p in odd.items()}}
    deployment = {"models": [{"name": n, "model_config": c, **({"version_labels": {"stable": 1}} if n == "toy" else {})}
                             for n, c in models.items()],
                  "json_decode_memory_bytes": BUDGET, "access_log": False, "body_read_timeout_seconds": 120}
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("v2_hostile")).start(timeout=240)
    assert set(proc.wait_models(120).values()) == {"ready"}, proc.log()[-5000:]
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()[-5000:]


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.grpc_target)
    yield ch
    ch.close()


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 120) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def strict_json(data: bytes):
    """json.loads refusing NaN / Infinity, as browsers, Go and Jackson do."""
    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(data, parse_constant=refuse)


def assert_refused(answer: tuple[int, dict, bytes], statuses: set[int], *words: str) -> str:
    status, _, data = answer
    assert status in statuses, (status, data[:500])
    assert len(data) <= MAX_MESSAGE, (len(data), data[:300])
    message = strict_json(data)["error"]
    assert message.isprintable(), message
    for word in words:
        assert word in message, message
    return message


def toy_infer(server, path: str = "/v2/models/toy/infer") -> tuple[int, dict, bytes]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 1], "data": X}]}
    return request(server, "POST", path, json.dumps(body).encode())


def assert_exact(server) -> None:
    """The next valid request is answered exactly (HTTP JSON, and gRPC)."""
    status, _, data = toy_infer(server)
    assert status == 200, data[:500]
    (out,) = strict_json(data)["outputs"]
    assert (out["name"], out["datatype"], out["shape"], out["data"]) == ("y", "FP32", [3, 1], sum(Y, []))


def grpc_error(call, message) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(message, timeout=60)
    return info.value


def assert_grpc_refused(err: grpc.RpcError, code: grpc.StatusCode, *words: str) -> None:
    assert err.code() == code, (err.code(), err.details()[:300])
    assert len(err.details()) <= MAX_MESSAGE, len(err.details())
    for word in words:
        assert word in err.details(), err.details()


def method(channel, name: str, response=None, service: str = "inference.GRPCInferenceService"):
    return channel.unary_unary(f"/{service}/{name}", request_serializer=lambda m: m if isinstance(m, bytes)
                               else m.SerializeToString(),
                               response_deserializer=response.FromString if response else None)


def v2_tensor(name: str, datatype: str, shape: list, data=None, binary: bytes | None = None) -> dict:
    tensor = {"name": name, "datatype": datatype, "shape": shape}
    if binary is not None:
        tensor["parameters"] = {"binary_data_size": len(binary)}
    else:
        tensor["data"] = data
    return tensor


def binary_request(inputs: list[dict], blobs: list[bytes], **extra) -> tuple[bytes, dict]:
    header = json.dumps({"inputs": inputs, **extra}).encode()
    return header + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(header))}


def read_binary(answer: tuple[int, dict, bytes]) -> dict[str, tuple[dict, bytes]]:
    status, headers, data = answer
    assert status == 200, data[:500]
    n = int(headers["inference-header-content-length"])
    doc, at, out = strict_json(data[:n]), n, {}
    for tensor in doc["outputs"]:
        size = tensor["parameters"]["binary_data_size"]
        out[tensor["name"]] = (tensor, data[at:at + size])
        at += size
    assert at == len(data)
    return out


# --- 1. shapes numpy cannot build ---------------------------------------------------------------

BAD_SHAPES = [[0, 4611686018427387904], [0, 10**30], [0] * 65, [0, 2**63 - 1, 2**62]]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=["2^62", "10^30", "rank65", "int64max"])
def test_shapes_numpy_cannot_build_are_400(server, channel, shape):
    body = json.dumps({"inputs": [v2_tensor("x", "FP32", shape, [])]}).encode()
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body), {400}, "shape")
    body, headers = binary_request([v2_tensor("x", "FP32", shape, binary=b"")], [b""])
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body, headers), {400}, "shape")
    if all(d < 2**63 for d in shape):  # gRPC's shape is int64
        infer = method(channel, "ModelInfer", pb.ModelInferResponse)
        raw = pb.ModelInferRequest(model_name="toy", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=shape)], raw_input_contents=[b""])
        assert_grpc_refused(grpc_error(infer, raw), grpc.StatusCode.INVALID_ARGUMENT, "shape")
        typed = pb.ModelInferRequest(model_name="toy", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=shape, contents=pb.InferTensorContents(fp32_contents=[]))])
        assert_grpc_refused(grpc_error(infer, typed), grpc.StatusCode.INVALID_ARGUMENT, "shape")
    assert_exact(server)


# --- 2, 3, 12. versions -------------------------------------------------------------------------

BAD_VERSIONS = ["%C2%B3", "%C2%B2", "%D9%A3", "9" * 5000, "9" * 20, "9223372036854775808", "-1", "1.0", "%20"]


@pytest.mark.parametrize("version", BAD_VERSIONS, ids=lambda v: v[:12])
def test_malformed_versions_are_400_on_every_v2_route(server, version):
    base = f"/v2/models/toy/versions/{version}"
    for answer in (request(server, "GET", base + "/ready"), request(server, "GET", base), toy_infer(server, base + "/infer")):
        assert_refused(answer, {400}, "version")
    assert_exact(server)


@pytest.mark.parametrize("version", ["9" * 5000, "9" * 20, "99999999999999999999999"])
def test_long_versions_on_tf_serving_rest_are_400(server, version):
    for answer in (request(server, "POST", f"/v1/models/toy/versions/{version}:predict", b'{"instances": [[1.0]]}'),
                   request(server, "GET", f"/v1/models/toy/versions/{version}"),
                   request(server, "GET", f"/v1/models/toy/versions/{version}/metadata")):
        assert_refused(answer, {400}, "version")
    status, _, data = request(server, "POST", "/v1/models/toy/versions/1:predict", b'{"instances": [[1.0]]}')
    assert (status, strict_json(data)) == (200, {"predictions": [[2.5]]})
    for path in ("/v1/models/toy/versions/%C2%B3:predict", "/v1/models/toy/versions/%C2%B3"):  # not TF Serving's grammar
        assert_refused(request(server, "POST" if path.endswith("predict") else "GET", path, b"{}"), {400})


@pytest.mark.parametrize("version", ["³", "²", "9" * 5000, "9" * 20, "-1"])
def test_malformed_versions_are_invalid_argument_on_grpc(server, channel, version):
    x = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 1],
                                               contents=pb.InferTensorContents(fp32_contents=[1.0]))
    for name, message, response in (
            ("ModelReady", pb.ModelReadyRequest(name="toy", version=version), pb.ModelReadyResponse),
            ("ModelMetadata", pb.ModelMetadataRequest(name="toy", version=version), pb.ModelMetadataResponse),
            ("ModelInfer", pb.ModelInferRequest(model_name="toy", model_version=version, inputs=[x]),
             pb.ModelInferResponse)):
        assert_grpc_refused(grpc_error(method(channel, name, response), message), grpc.StatusCode.INVALID_ARGUMENT,
                            "version")
    assert_exact(server)


def test_readiness_of_a_version_not_served_is_404_like_metadata(server, channel):
    for path in ("/v2/models/toy/versions/999/ready", "/v2/models/toy/versions/999",
                 "/v2/models/toy/versions/999/infer"):
        answer = toy_infer(server, path) if path.endswith("infer") else request(server, "GET", path)
        assert_refused(answer, {404}, "999")
    assert request(server, "GET", "/v2/models/toy/versions/1/ready")[0] == 200
    ready = method(channel, "ModelReady", pb.ModelReadyResponse)
    assert not ready(pb.ModelReadyRequest(name="toy", version="999")).ready  # tritonclient reads the flag
    assert ready(pb.ModelReadyRequest(name="toy", version="1")).ready


# --- 4. bytes that are not a message ------------------------------------------------------------

GRPC_METHODS = [("inference.GRPCInferenceService", m) for m in
                ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")] + [
    ("tensorflow.serving.PredictionService", "Predict"),
    ("tensorflow.serving.PredictionService", "GetModelMetadata"),
    ("tensorflow.serving.ModelService", "GetModelStatus")]


@pytest.mark.parametrize("service, name", GRPC_METHODS, ids=lambda v: v.rsplit(".", 1)[-1])
def test_grpc_bytes_that_are_not_a_message_are_invalid_argument(server, channel, service, name):
    call = method(channel, name, service=service)
    for garbage in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08"):
        assert_grpc_refused(grpc_error(call, garbage), grpc.StatusCode.INVALID_ARGUMENT, "not a serialized")
    assert_exact(server)


# --- 5. BF16 ------------------------------------------------------------------------------------

def test_bf16_inputs_and_outputs_over_every_transport(server):
    values = np.array([1.5, -0.25, 3.0], ml_dtypes.bfloat16)
    want = (values.astype(np.float32) * 2).tolist()
    status, _, data = request(server, "GET", "/v2/models/half")
    assert status == 200 and strict_json(data)["outputs"][0]["datatype"] == "BF16"
    body = json.dumps({"inputs": [v2_tensor("v", "BF16", [3], values.astype(np.float32).tolist())]}).encode()
    status, _, data = request(server, "POST", "/v2/models/half/infer", body)
    assert status == 200, data[:500]
    (out,) = strict_json(data)["outputs"]
    assert (out["datatype"], out["data"]) == ("BF16", want)
    raw = values.view(np.uint16).astype("<u2").tobytes()
    body, headers = binary_request([v2_tensor("v", "BF16", [3], binary=raw)], [raw],
                                   parameters={"binary_data_output": True})
    tensor, blob = read_binary(request(server, "POST", "/v2/models/half/infer", body, headers))["twice"]
    assert tensor["datatype"] == "BF16"
    assert np.frombuffer(blob, "<u2").view(ml_dtypes.bfloat16).astype(np.float32).tolist() == want
    with tgrpc.InferenceServerClient(server.grpc_target) as client:
        tensor = tgrpc.InferInput("v", [3], "BF16")
        tensor.set_data_from_numpy(values)  # tritonclient sends ml_dtypes.bfloat16 arrays raw
        result = client.infer("half", [tensor])
        assert result.get_response().outputs[0].datatype == "BF16"
        assert result.as_numpy("twice").astype(np.float32).tolist() == want
    assert_exact(server)


# --- 6. BOOL bytes ------------------------------------------------------------------------------

def test_raw_bool_bytes_other_than_0_and_1_are_400(server, channel):
    for raw in (b"\x02", b"\x00\x01\xff"):
        body, headers = binary_request([v2_tensor("flag", "BOOL", [len(raw)], binary=raw)], [raw])
        assert_refused(request(server, "POST", "/v2/models/logic/infer", body, headers), {400}, "BOOL", "0", "1")
        message = pb.ModelInferRequest(model_name="logic", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="flag", datatype="BOOL", shape=[len(raw)])], raw_input_contents=[raw])
        assert_grpc_refused(grpc_error(method(channel, "ModelInfer", pb.ModelInferResponse), message),
                            grpc.StatusCode.INVALID_ARGUMENT, "BOOL")
    body, headers = binary_request([v2_tensor("flag", "BOOL", [2], binary=b"\x01\x00")], [b"\x01\x00"],
                                   parameters={"binary_data_output": True})
    tensor, blob = read_binary(request(server, "POST", "/v2/models/logic/infer", body, headers))["not"]
    assert (tensor["datatype"], blob) == ("BOOL", b"\x00\x01")


# --- 7. BYTES that are not UTF-8 in JSON --------------------------------------------------------

def test_bytes_outputs_that_are_not_utf8_need_binary(server):
    words = [b"\xff\xfe", "caf\u00e9".encode()]
    raw = b"".join(struct.pack("<I", len(w)) + w for w in words)
    body, headers = binary_request([v2_tensor("word", "BYTES", [2], binary=raw)], [raw])
    assert_refused(request(server, "POST", "/v2/models/echo/infer", body, headers), {400},
                   "not UTF-8", "binary_data_output")
    body, headers = binary_request([v2_tensor("word", "BYTES", [2], binary=raw)], [raw],
                                   parameters={"binary_data_output": True})
    assert read_binary(request(server, "POST", "/v2/models/echo/infer", body, headers))["same"][1] == raw
    body = json.dumps({"inputs": [v2_tensor("word", "BYTES", [1], ["caf\u00e9"])]}).encode()
    status, _, data = request(server, "POST", "/v2/models/echo/infer", body)
    assert status == 200 and strict_json(data)["outputs"][0]["data"] == ["caf\u00e9"]


# --- 8. names echoed ----------------------------------------------------------------------------

def test_client_names_are_echoed_cut(server, channel):
    huge = "n" * 1_000_000
    body = json.dumps({"inputs": [v2_tensor(huge, "FP32", [1, 1], [1.0])]}).encode()
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body), {400}, "characters")
    body = json.dumps({"inputs": [v2_tensor("x", "FP32", [1, 1], [1.0])], "outputs": [{"name": huge}]}).encode()
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body), {400}, "characters")
    long_name = "m" * 12_000  # within max_header_bytes (16 KiB)
    assert_refused(request(server, "GET", f"/v2/models/{long_name}"), {404}, "characters")
    assert_refused(request(server, "POST", f"/v1/models/toy/labels/{long_name}:predict", b'{"instances": [[1.0]]}'),
                   {400}, "characters")
    err = grpc_error(method(channel, "ModelMetadata", pb.ModelMetadataResponse), pb.ModelMetadataRequest(name=huge))
    assert_grpc_refused(err, grpc.StatusCode.NOT_FOUND, "characters")
    message = pb.ModelInferRequest(model_name="toy", inputs=[pb.ModelInferRequest.InferInputTensor(
        name=huge, datatype="FP32", shape=[1, 1], contents=pb.InferTensorContents(fp32_contents=[1.0]))])
    assert_grpc_refused(grpc_error(method(channel, "ModelInfer", pb.ModelInferResponse), message),
                        grpc.StatusCode.INVALID_ARGUMENT, "characters")
    assert_exact(server)


# --- 9. memory: the decode budget ---------------------------------------------------------------

def big_invalid_body(size: int) -> bytes:
    """About ``size`` bytes of v2 JSON for the toy whose last element is not a number."""
    n = size // 5
    return (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [' + str(n + 1).encode() +
            b', 1], "data": [' + b"1.25," * n + b'"x"]}]}')


def test_large_v2_json_is_decoded_exactly(server):
    n = 400_000  # ~3 MB of JSON: the large-body path, a run at a time
    x = (np.arange(n, dtype=np.float32) % 1000 - 500).reshape(n, 1)
    body = json.dumps({"inputs": [v2_tensor("x", "FP32", [n, 1], x.tolist())]}).encode()
    status, _, data = request(server, "POST", "/v2/models/toy/infer", body)
    assert status == 200, data[:500]
    (out,) = strict_json(data)["outputs"]
    assert out["shape"] == [n, 1] and out["data"] == (0.5 * x + 2).ravel().tolist()


def test_four_32mb_invalid_bodies_at_once_stay_within_the_budget(server):
    body = big_invalid_body(32 * MB)
    pid = server.proc.pid
    before = reset_peak(pid)
    results, latencies, stop = [], [], threading.Event()

    def one() -> None:
        results.append(request(server, "POST", "/v2/models/toy/infer", body))

    def probe() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            assert request(server, "GET", "/healthz", timeout=30)[0] == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    senders = [threading.Thread(target=one) for _ in range(4)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    stop.set()
    prober.join()
    growth = status_kb(pid)["VmHWM"] - before
    print(f"\n4 x {len(body) / MB:.0f} MB invalid v2 bodies: statuses {sorted(r[0] for r in results)}, "
          f"peak RSS growth {growth / MB:.0f} MB (json_decode_memory_bytes {BUDGET / MB:.0f} MB), "
          f"/healthz worst {max(latencies, default=0) * 1000:.0f} ms over {len(latencies)} probes")
    assert len(results) == 4 and latencies
    for answer in results:
        assert_refused(answer, {400, 503}, "x" if answer[0] == 400 else "json_decode_memory_bytes")
    assert growth <= BUDGET, f"peak RSS growth {growth / MB:.0f} MB over the budget"
    assert_exact(server)


def test_element_limit_and_body_limit(server):
    body = json.dumps({"inputs": [v2_tensor("x", "FP32", [2**40, 1], [1.0])]}).encode()
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body), {400, 413})
    assert_exact(server)


# --- 10. BYTES contents past the shape's count --------------------------------------------------

def test_bytes_elements_beyond_the_shape_are_refused(server, channel):
    raw = struct.pack("<I", 0) * 2_000_000
    body, headers = binary_request([v2_tensor("sparse_tokens", "BYTES", [1], binary=raw)], [raw])
    assert_refused(request(server, "POST", "/v2/models/demo/infer", body, headers), {400}, "BYTES")
    message = pb.ModelInferRequest(model_name="echo", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="word", datatype="BYTES", shape=[1])], raw_input_contents=[raw])
    assert_grpc_refused(grpc_error(method(channel, "ModelInfer", pb.ModelInferResponse), message),
                        grpc.StatusCode.INVALID_ARGUMENT, "BYTES")


# --- 11. Content-Encoding -----------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_from_tritonclient(server, algorithm):
    with thttp.InferenceServerClient(server.http.removeprefix("http://")) as client:
        tensor = thttp.InferInput("x", [3, 1], "FP32")
        tensor.set_data_from_numpy(np.array(X, np.float32), binary_data=algorithm == "gzip")
        result = client.infer("toy", [tensor], request_compression_algorithm=algorithm)
        assert result.as_numpy("y").tolist() == Y


def test_unknown_encodings_and_bombs_are_refused(server):
    body = json.dumps({"inputs": [v2_tensor("x", "FP32", [3, 1], X)]}).encode()
    headers = {"Content-Type": "application/json", "Content-Encoding": "br"}
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body, headers), {400}, "br")
    bomb = gzip.compress(b" " * (80 * MB))  # inflates past max_request_bytes (64 MiB)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    assert_refused(request(server, "POST", "/v2/models/toy/infer", bomb, headers), {413}, "inflates")
    for bad in (b"not gzip at all", gzip.compress(body)[:-9], zlib.compress(body)):
        assert_refused(request(server, "POST", "/v2/models/toy/infer", bad, headers), {400}, "gzip")
    assert_exact(server)


# --- 13. non-finite numbers in JSON, warnings ---------------------------------------------------

def test_json_responses_never_carry_nan_and_casts_print_no_warning(server):
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1], "data": [NaN, 1.0]}]}'
    assert_refused(request(server, "POST", "/v2/models/toy/infer", body), {400}, "NaN", "binary_data_output")
    body = body[:-1] + b', "parameters": {"binary_data_output": true}}'
    tensor, blob = read_binary(request(server, "POST", "/v2/models/toy/infer", body))["y"]
    y = np.frombuffer(blob, "<f4")
    assert np.isnan(y[0]) and y[1] == 2.5
    for data in ("[1e39]", "[-1e300]"):
        body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": ' + data.encode() + b"}]}"
        assert_refused(request(server, "POST", "/v2/models/toy/infer", body), {400}, "within")
    assert_exact(server)


def test_nothing_logged_as_an_internal_error(server):
    log = server.log()
    for marker in ("internal error", "Traceback", "RuntimeWarning", "Exception deserializing",
                   "--- Logging error ---"):
        assert marker not in log, log[-5000:]
    assert max((len(line) for line in log.splitlines()), default=0) <= 4096
