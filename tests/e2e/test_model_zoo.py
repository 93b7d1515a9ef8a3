"""The model zoo over every path (issue 14 item 3): one real server serving each zoo model.

Zoo: Estimator-style wide & deep with a serialized tf.Example signature and with raw placeholders
(:mod:`models.wide_deep`), the TF2 ``tf.Module`` models of :mod:`models.tf2_zoo` (embedding on a
variable, ``StaticHashTable``, int64 hashing, Keras ``Hashing``, a ``py_function``), a Keras 3
DCN with ``StringLookup``/``IntegerLookup``/``Hashing`` and a TF1 vocabulary-table model
(:mod:`models.zoo_more`).

Every model (but the ``py_function`` one, whose Python body only the building process holds) is
served with ``backend: tensorflow`` and, where it converts, with
``backend: onnxruntime`` (two entries of one deployment). Each served entry is compared with
plain TensorFlow on the same SavedModel and checkpoint over the Python ABI (in-process), TF
Serving REST (rows; serialized tf.Examples as ``{"b64": ...}``) and TF Serving gRPC: the
TensorFlow backend exactly, ONNX Runtime within 1e-5 (integer outputs exactly). A model that does
not convert is refused by ``Processor.create`` with a ConfigError naming the reason and
``backend: tensorflow``.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from processor import abi, codec
from processor.errors import ConfigError
from sp_checks import FLOAT_ATOL, assert_outputs_close

EXAMPLE_ROWS = [
    {"age": [31.0], "hours": [1.5, 2.0], "item_id": [3, 17, 49], "city": [b"paris"]},
    {"age": [54.0], "item_id": [120], "city": [b"oslo", b"lima"]},
    {"age": [19.0], "hours": [0.0, 7.0]},
    {"age": [40.0], "hours": [3.0, 3.0], "item_id": [0], "city": [b""]},
]
EDGES = [0, 1, -1, 7, 10 ** 9, 123456789012, 2 ** 63 - 1, -2 ** 63, -2 ** 63 + 1]


def _feeds(name: str) -> dict[str, np.ndarray]:
    if name == "wide_deep_examples":
        from models.wide_deep import example_bytes

        return {"examples": example_bytes(EXAMPLE_ROWS)}
    return {
        "wide_deep_raw": lambda: {
            "age": np.array([[31.0], [54.0], [19.0]], np.float32),
            "hours": np.array([[1.5, 2.0], [0.0, 0.0], [0.0, 7.0]], np.float32),
            "item_id": np.array([[3, 17, 49], [120, 0, 0], [5, 5, 5]], np.int64),
            "city": np.array([b"paris", b"oslo", b""], dtype=object)},
        "embedding_module": lambda: {"ids": np.array([0, 3, 9, 12, -1, 7], np.int64),
                                     "dense": np.arange(12, dtype=np.float32).reshape(6, 2) / 4},
        "static_hash_table": lambda: {"token": np.array([b"apple", b"zzz", b"elder", b"banana", b""], object)},
        "int64_hashing": lambda: {"user_id": np.array(EDGES + [10 ** k for k in range(19)], np.int64)},
        "keras_hashing": lambda: {"item_id": np.array(EDGES, np.int64)},
        "py_function": lambda: {"x": np.array([1.0, -2.5, 0.125], np.float32)},
        "keras_dcn": lambda: {"country": np.array([b"fr", b"xx", b"jp", b"", b"no"], object),
                              "item_id": np.array([3, 5, 2024, -1, 42], np.int64),
                              "user_id": np.array([0, 7, -2 ** 63, 2 ** 63 - 1, 99], np.int64),
                              "dense": np.arange(15, dtype=np.float32).reshape(5, 3) / 8},
        "tf1_vocab_table": lambda: {"word": np.array([b"alpha", b"zzz", b"delta", b"", b"beta"], object)},
    }[name]()


# name -> None when ONNX Runtime serves it, else the reason its ConfigError names
ZOO = {
    "wide_deep_examples": "ParseExampleV2",
    "wide_deep_raw": "cannot run on strings",
    "embedding_module": None,
    "static_hash_table": None,
    "int64_hashing": None,
    "keras_hashing": None,
    "py_function": "EagerPyFunc",
    "keras_dcn": "LookupTableFindV2",
    "tf1_vocab_table": "LookupTableFindV2",
}
# py_function's Python body is not in the SavedModel (only in the registry of the process that
# built it): no other process can run it, so it is checked only for the ONNX refusal.
SERVED = [(name, "tensorflow") for name in ZOO if name != "py_function"] + [(name, "onnxruntime") for name, why in ZOO.items() if why is None]
REFUSED = [name for name, why in ZOO.items() if why is not None]


def _build(name: str, out):
    from models import tf2_zoo, wide_deep, zoo_more

    if name.startswith("wide_deep_"):
        return wide_deep.build_wide_deep(out, examples=name == "wide_deep_examples")
    module = zoo_more if hasattr(zoo_more, f"build_{name}") else tf2_zoo
    return getattr(module, f"build_{name}")(out)


def _config(paths, backend: str) -> dict:
    # per-session pools: ONNX Runtime's global pools are process state that later tests (the
    # in-process ABI processors here, tests/integration) must not inherit
    extra = {"use_per_session_threads": True} if backend == "onnxruntime" else {}
    return model_config(paths, backend=backend, **extra)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name -> (ModelPaths, feeds, plain TensorFlow's outputs on the served checkpoint)."""
    built = {}
    for name in ZOO:
        paths = _build(name, tmp_path_factory.mktemp(name) / "model")
        feeds = _feeds(name)
        built[name] = (paths, feeds, plain_tf_predict(paths.savedmodel_dir, paths.latest_checkpoint_prefix, feeds))
    return built


def _entry(name: str, backend: str) -> str:
    return f"{name}_{'tf' if backend == 'tensorflow' else 'ort'}"


@pytest.fixture(scope="module")
def server(zoo, tmp_path_factory):
    from tools.server_process import ServerProcess

    deployment = {"models": [{"name": _entry(name, backend), "model_config": _config(zoo[name][0], backend)}
                             for name, backend in SERVED],
                  "access_log": False, "drain_timeout_seconds": 5}
    proc = ServerProcess(deployment, tmp_path_factory.mktemp("zoo_server")).start(timeout=240)
    states = proc.wait_models(120)
    assert states == {_entry(n, b): "ready" for n, b in SERVED}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.grpc_target)
    yield ch
    ch.close()


def _same(got: dict, want: dict[str, np.ndarray], backend: str, how: str) -> None:
    # served in another process with other thread settings; ONNX Runtime with its own kernels
    assert_outputs_close(got, want, how, atol=1e-5 if backend == "onnxruntime" else FLOAT_ATOL)


def _json_value(key: str, value):
    if isinstance(value, np.ndarray):
        return [_json_value(key, v) for v in value]
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()} if key == "examples" else value.decode()
    return value.item()


def _rest_rows(server, entry: str, feeds: dict[str, np.ndarray], want: dict) -> dict:
    n = len(next(iter(feeds.values())))
    rows = [{k: _json_value(k, v[i]) for k, v in feeds.items()} for i in range(n)]
    req = urllib.request.Request(f"{server.http}/v1/models/{entry}:predict", method="POST",
                                 data=json.dumps({"instances": rows}).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, body = resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    assert status == 200, body
    predictions = body["predictions"]
    assert len(predictions) == n
    if len(want) == 1:
        predictions = [{next(iter(want)): p} for p in predictions]
    return {k: [p[k] for p in predictions] for k in want}


def _tfs_grpc(channel, entry: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = entry
    request.model_spec.signature_name = "serving_default"
    for key, array in feeds.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(array))
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert response.model_spec.name == entry
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


@pytest.mark.parametrize(("name", "backend"), SERVED, ids=[_entry(n, b) for n, b in SERVED])
def test_zoo_model_equals_tensorflow_on_every_path(zoo, server, channel, name, backend):
    paths, feeds, want = zoo[name]
    handle = abi.initialize("", json.dumps(_config(paths, backend)))
    try:
        assert handle.model_info()["session_group"]["engine"] == backend
        status, body = abi.process(handle, codec.encode_request(feeds))
        assert status == 200, body
        _same(codec.decode_response(body), want, backend, "ABI")
    finally:
        abi.finalize(handle)
    entry = _entry(name, backend)
    assert server.get_json(f"/api/models/{entry}")["session_group"]["engine"] == backend
    _same(_rest_rows(server, entry, feeds, want), want, backend, "TF Serving REST")
    _same(_tfs_grpc(channel, entry, feeds), want, backend, "TF Serving gRPC")


def test_the_checkpoint_serves_not_the_savedmodel(zoo):
    """The references are the checkpoint's values: they differ from the SavedModel's own."""
    for name in ("wide_deep_examples", "keras_dcn", "tf1_vocab_table"):
        paths, feeds, want = zoo[name]
        own = plain_tf_predict(paths.savedmodel_dir, None, feeds)
        floats = [k for k in want if want[k].dtype.kind == "f"]
        assert floats and any(not np.array_equal(own[k], want[k]) for k in floats), name


@pytest.mark.parametrize("name", REFUSED)
def test_onnxruntime_refuses_clearly(zoo, name):
    from processor.processor import Processor

    with pytest.raises(ConfigError) as err:
        Processor.create("", json.dumps(_config(zoo[name][0], "onnxruntime"))).close()
    assert ZOO[name] in err.value.message and "backend: tensorflow" in err.value.message, err.value.message
