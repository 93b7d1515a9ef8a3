"""TF2 SavedModels through the ONNX Runtime backend (issue 14 item 2): tf2onnx's TF2 path.

Each model of :mod:`models.tf2_zoo` is served with ``backend: onnxruntime`` and compared with
plain TensorFlow on the same SavedModel and checkpoint, or refused with a ConfigError naming
the reason and ``backend: tensorflow``.
"""

import json

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from processor import abi, codec
from processor.errors import ConfigError


@pytest.fixture(autouse=True)
def fresh_onnx_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SP_ONNX_CACHE_DIR", str(tmp_path / "onnx-cache"))


def build(tmp_path_factory, name):
    from models import tf2_zoo

    return getattr(tf2_zoo, f"build_{name}")(tmp_path_factory.mktemp(name) / "model")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            built[name] = build(tmp_path_factory, name)
        return built[name]

    return get


def ort_config(paths, **overrides):
    return model_config(paths, backend="onnxruntime", use_per_session_threads=True, **overrides)


def serve_and_compare(make_processor, paths, feeds):
    p = make_processor(ort_config(paths, session_num=2))
    status, body = p.process(codec.encode_request(feeds))
    assert status == 200, body
    got = codec.decode_response(body)
    want = plain_tf_predict(paths.savedmodel_dir, paths.latest_checkpoint_prefix, feeds)
    assert set(got) == set(want)
    for key in want:
        if want[key].dtype.kind == "f":
            np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5)
        else:
            np.testing.assert_array_equal(got[key], want[key])
    model = p.model_info()["session_group"]["model"]
    assert model["check"]["status"] == "passed"
    assert model["source"]["path"].startswith("tf2")
    return p, model


def test_embedding_lookup_on_a_variable(zoo, make_processor):
    paths = zoo("embedding_module")
    _, model = serve_and_compare(make_processor, paths, {"ids": np.array([0, 3, 9, 12, -1, 7], np.int64),
                                                          "dense": np.arange(12, dtype=np.float32).reshape(6, 2)})
    # every variable is a parameter the processor holds and deltas can update in place
    assert model["variables_not_updatable"] == []
    assert model["cache_hit"] is False


def test_embedding_delta_reaches_the_served_graph(zoo):
    from processor.checkpoint.delta import Delta
    from processor.config import ModelConfig
    from processor.engine.open_group import open_session_group
    from processor.store.model_version import ModelVersion

    paths = zoo("embedding_module")
    config = ModelConfig.from_dict(ort_config(paths, session_num=2))
    version = ModelVersion(1, -1, full_prefix=str(paths.latest_checkpoint_prefix),
                           savedmodel_dir=str(paths.savedmodel_dir))
    group = open_session_group(config, version)
    try:
        variables = group.backend.variables
        table = next(name for name, info in variables.items() if tuple(info.shape) == (10, 4))
        w = next(name for name, info in variables.items() if tuple(info.shape) == (4, 1))
        group.backend.apply_delta(Delta(2, rows={table: (np.array([3], np.int64), np.ones((1, 4), np.float32))},
                                        dense={w: np.full((4, 1), 0.5, np.float32)}))
        ids = {"ids": np.array([3, 13], np.int64), "dense": np.zeros((2, 2), np.float32)}
        for lane in range(2):  # row 3 = ones, w = 0.5: 4 * 0.5 + b (2.0 in the checkpoint)
            np.testing.assert_allclose(group.run_on(lane, ids, ("score",))[0], [[4.0], [4.0]], atol=1e-6)
    finally:
        group.close()


def test_static_hash_table_string_to_int64(zoo, make_processor):
    paths = zoo("static_hash_table")
    feeds = {"token": np.array([b"apple", b"zzz", b"elder", b"banana", b""], object)}
    _, model = serve_and_compare(make_processor, paths, feeds)
    assert model["string_inputs_hashed_by_processor"] == []
    assert model["variables_not_updatable"] == []


def test_int64_hashing_runs_in_the_graph(zoo, make_processor):
    paths = zoo("int64_hashing")
    edges = [0, 1, -1, 2 ** 63 - 1, -2 ** 63, -2 ** 63 + 1]
    edges += [sign * 10 ** k + d for k in range(19) for d in (-1, 0, 1) for sign in (1, -1)]
    ids = np.concatenate([np.array(edges, np.int64),
                          np.random.default_rng(3).integers(-2 ** 63, 2 ** 63 - 1, 300, dtype=np.int64)])
    _, model = serve_and_compare(make_processor, paths, {"user_id": ids})
    assert model["string_inputs_hashed_by_processor"] == []


def test_keras_hashing_of_int64_ids(zoo, make_processor):
    pytest.importorskip("keras", minversion="3")
    paths = zoo("keras_hashing")
    ids = np.array([0, -1, 7, 10 ** 9, -2 ** 63, 2 ** 63 - 1, 123456789012], np.int64)
    serve_and_compare(make_processor, paths, {"item_id": ids})


def test_py_function_is_refused_clearly(zoo):
    paths = zoo("py_function")
    with pytest.raises(ConfigError) as err:
        abi.initialize("", json.dumps(ort_config(paths)))
    assert "backend: tensorflow" in err.value.message and "EagerPyFunc" in err.value.message


def test_refused_models_serve_with_tensorflow(zoo, make_processor):
    paths = zoo("py_function")
    p = make_processor(model_config(paths, backend="tensorflow"))
    status, body = p.process(codec.encode_request({"x": np.array([1.0, 2.0], np.float32)}))
    assert status == 200, body
    want = plain_tf_predict(paths.savedmodel_dir, paths.latest_checkpoint_prefix, {"x": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_allclose(codec.decode_response(body)["y"], want["y"], atol=1e-6)


def test_tf2_toy_converts_on_the_tf2_path_and_takes_deltas(toy_model_tf2):
    from processor.checkpoint.delta import Delta
    from processor.config import ModelConfig
    from processor.engine.open_group import open_session_group
    from processor.store.model_version import ModelVersion

    config = ModelConfig.from_dict(ort_config(toy_model_tf2, session_num=2))
    version = ModelVersion(1, -1, full_prefix=str(toy_model_tf2.latest_checkpoint_prefix),
                           savedmodel_dir=str(toy_model_tf2.savedmodel_dir))
    group = open_session_group(config, version)
    x = {"x": np.array([[1.0]], np.float32)}
    try:
        assert group.run_on(0, x, ("y",))[0].tolist() == [[2.5]]
        assert {"a", "b"} <= set(group.backend.variables)
        group.backend.apply_delta(Delta(2, dense={"a": np.array(2.0, np.float32)}))
        assert [group.run_on(lane, x, ("y",))[0].tolist() for lane in range(2)] == [[[4.0]], [[4.0]]]
    finally:
        group.close()


def _string_graph(nodes, inputs, initializers=()):
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.STRING, [None]) for n in inputs],
                              [helper.make_tensor_value_info("out", TensorProto.INT64, [None])], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3),
                                                   helper.make_opsetid("ai.onnx.contrib", 1)], ir_version=8)


def test_string_rewrite_keeps_lookup_inputs_and_hashes_the_others():
    from onnx import TensorProto, helper, numpy_helper

    from processor.engine.onnx.hash_rewrite import rewrite_string_hashing

    buckets = numpy_helper.from_array(np.array(7, np.int64), "n")
    model = _string_graph([
        helper.make_node("LabelEncoder", ["tok"], ["id"], domain="ai.onnx.ml", keys_strings=["a"], values_int64s=[1]),
        helper.make_node("StringToHashBucketFast", ["h"], ["b"], domain="ai.onnx.contrib"),
        helper.make_node("Add", ["id", "b"], ["out"])], ["tok", "h"], [buckets])
    model.graph.node[1].input.append("n")
    assert rewrite_string_hashing(model) == ["h"]
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    assert types == {"tok": TensorProto.STRING, "h": TensorProto.UINT64}


def test_string_rewrite_refuses_mixed_and_computed_strings():
    from onnx import helper, numpy_helper

    from processor.engine.onnx.hash_rewrite import rewrite_string_hashing

    buckets = numpy_helper.from_array(np.array(7, np.int64), "n")
    mixed = _string_graph([
        helper.make_node("LabelEncoder", ["tok"], ["id"], domain="ai.onnx.ml", keys_strings=["a"], values_int64s=[1]),
        helper.make_node("StringToHashBucketFast", ["tok", "n"], ["b"], domain="ai.onnx.contrib"),
        helper.make_node("Add", ["id", "b"], ["out"])], ["tok"], [buckets])
    with pytest.raises(ConfigError, match="both hashing and a lookup table.*backend: tensorflow"):
        rewrite_string_hashing(mixed)
    computed = _string_graph([
        helper.make_node("Cast", ["x"], ["s"], to=8),  # tf.strings.as_string of a float: not hashed
        helper.make_node("StringToHashBucketFast", ["s", "n"], ["out"], domain="ai.onnx.contrib")], [], [buckets])
    computed.graph.input.append(helper.make_tensor_value_info("x", 1, [None]))
    with pytest.raises(ConfigError, match=r"computed in the graph \(made by \['Cast'\].*backend: tensorflow"):
        rewrite_string_hashing(computed)
