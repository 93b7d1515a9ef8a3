"""The ONNX Runtime backend: same answers as TensorFlow, same SessionGroup contract."""

import json

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from processor import abi, codec
from processor.errors import ConfigError, Internal
from sp_checks import concurrent_mismatches

X1 = {"x": np.array([[1.0]], np.float32)}


def ort_config(paths, **overrides):
    # Per-session pools by default: ORT's global pools are process state that would force every
    # later session in this test process onto them (tested in a child process below).
    return model_config(paths, **{"backend": "onnxruntime", "use_per_session_threads": True, **overrides})


def predict(processor, inputs, output_filter=None):
    status, body = processor.process(codec.encode_request(inputs, output_filter))
    assert status == 200, body
    return codec.decode_response(body)


def test_demo_model_equals_tensorflow(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(ort_config(ctr_model_small, session_num=2))
    for batch, seed in ((1, 3), (64, 4), (256, 5)):
        feeds = synthetic_batch(batch, seed)
        got = predict(p, feeds)
        want = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)
        assert set(got) == set(want) == {"probability", "logits"}
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5)
    info = p.model_info()["session_group"]
    assert info["engine"] == "onnxruntime" and info["sessions"] == 2
    assert info["model"]["check"]["status"] == "passed"
    assert info["model"]["string_inputs_hashed_by_processor"] == ["sparse_tokens"]
    assert info["model"]["variables_not_updatable"] == []


def test_conversion_is_cached(ctr_model_small, make_processor):
    first = make_processor(ort_config(ctr_model_small)).model_info()["session_group"]["model"]
    second = make_processor(ort_config(ctr_model_small)).model_info()["session_group"]["model"]
    assert second["cache_hit"] and second["cache"] == first["cache"]


def test_toy_through_onnxruntime_gives_2_5(toy_model, make_processor):
    p = make_processor(ort_config(toy_model))
    assert predict(p, X1)["y"].tolist() == [[2.5]]
    assert predict(p, {"x:0": np.array([[2.0], [4.0]], np.float32)}, ["y"])["y"].tolist() == [[3.0], [4.0]]


def _toy_onnx(path, a: float, b: float) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["ax"]), helper.make_node("Add", ["ax", "b"], ["y"])], "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(np.array(a, np.float32), "a"), numpy_helper.from_array(np.array(b, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(exist_ok=True)
    onnx.save(model, str(path))


def test_onnx_file_is_served_by_onnxruntime(tmp_path, make_processor):
    _toy_onnx(tmp_path / "m" / "model.onnx", 0.5, 2.0)
    p = make_processor({"savedmodel_dir": str(tmp_path / "m"), "use_per_session_threads": True})
    assert predict(p, X1)["y"].tolist() == [[2.5]]
    assert p.model_info()["session_group"]["engine"] == "onnxruntime"


def _entry(processor) -> dict:
    return processor.model_info()["session_group"]["model"]


def test_an_onnx_file_written_again_is_prepared_again(tmp_path, make_processor):
    """The cache keys a .onnx file by its identity (path, size, mtime, inode), not its bytes: the
    same file again is a hit; the file written again with other weights of the same size is not."""
    path = tmp_path / "m" / "model.onnx"
    _toy_onnx(path, 0.5, 2.0)
    config = {"savedmodel_dir": str(tmp_path / "m"), "use_per_session_threads": True}
    first = make_processor(config)
    again = make_processor(config)
    assert _entry(again)["cache_hit"] and _entry(again)["cache"] == _entry(first)["cache"]
    size = path.stat().st_size
    _toy_onnx(path, 1.0, 3.0)
    assert path.stat().st_size == size
    rewritten = make_processor(config)
    assert _entry(rewritten)["cache_hit"] is False and predict(rewritten, X1)["y"].tolist() == [[4.0]]


@pytest.mark.parametrize("overrides", [
    {"session_num": 3, "select_session_policy": "RR"},
    {"session_num": 2, "use_per_session_threads": True, "select_session_policy": "MOD"},
    {"session_num": 2, "enable_inline_execute": True, "intra_op_parallelism_threads": 2},
    {"session_num": 2, "use_per_session_threads": True, "cpusets": "0;0"},
])
def test_session_group_settings_serve_the_same(toy_model, make_processor, overrides):
    p = make_processor(ort_config(toy_model, **overrides))
    for _ in range(6):
        assert predict(p, X1)["y"].tolist() == [[2.5]]
    group = p.model_info()["session_group"]
    assert group["session_num"] == overrides["session_num"] == group["sessions"]


_GLOBAL_POOLS_SCRIPT = """
import json, sys
import numpy as np
from processor.processor import Processor
from processor import codec
cfg = json.loads(sys.argv[1])
shared = Processor.create("", json.dumps(dict(cfg, use_per_session_threads=False, intra_op_parallelism_threads=2)))
own = Processor.create("", json.dumps(dict(cfg, use_per_session_threads=True)))
out = []
for p in (shared, own):
    status, body = p.process(codec.encode_request({"x": np.array([[1.0]], np.float32)}))
    out.append([status, codec.decode_response(body)["y"].tolist(), p.model_info()["session_group"]["threads"]])
print(json.dumps(out))
"""


def test_global_pools_and_their_process_wide_rule(toy_model, tmp_path):
    """Global pools are process state, so this runs in a child process."""
    import os
    import subprocess
    import sys

    cfg = ort_config(toy_model, session_num=2)
    env = dict(os.environ, SP_ONNX_CACHE_DIR=str(tmp_path), PYTHONPATH=os.getcwd())
    run = subprocess.run([sys.executable, "-c", _GLOBAL_POOLS_SCRIPT, json.dumps(cfg)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    shared, own = json.loads(run.stdout.strip().splitlines()[-1])
    assert shared[:2] == own[:2] == [200, [[2.5]]]
    assert shared[2] == {"mode": "global pools", "sizes_in_force": [2, 1]}
    assert own[2]["mode"] == "global pools" and "refuses per-session pools" in own[2]["note"]
    # cpusets with shared pools cannot pin anything, and say so


def test_pinning_is_reported_exactly(toy_model, make_processor):
    p = make_processor(ort_config(toy_model, session_num=2, use_per_session_threads=True,
                                  cpusets="0;0", intra_op_parallelism_threads=3))
    pins = p.model_info()["session_group"]["pinning"]
    assert [s["cpus"] for s in pins["sessions"]] == [[0], [0]], pins
    # intra 3 = the calling thread + 2 pool workers, both pinned
    assert [s["threads_pinned"] for s in pins["sessions"]] == [2, 2], pins


def test_affinity_string_format():
    from processor.engine.onnx.ort_env import intra_op_affinities

    assert intra_op_affinities((0,), 2) == "1"
    assert intra_op_affinities((0, 1), 3) == "1,2;1,2"
    assert intra_op_affinities((3,), 1) == ""


@pytest.mark.parametrize("policy", ["RR", "MOD"])
def test_8_threads_x_500_calls_equal_single_threaded(ctr_model_small, make_processor, policy):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(ort_config(ctr_model_small, session_num=4, use_per_session_threads=True,
                                  select_session_policy=policy))
    requests = [codec.encode_request(synthetic_batch(4, seed)) for seed in range(8)]
    errors = concurrent_mismatches(p.process, requests, threads=8, calls=500)
    assert errors == []


def test_parameter_updates_reach_every_session_like_tensorflow(ctr_model_small):
    """One copy of the weights: an in-place write is seen by all sessions and matches TF."""
    import tensorflow as tf

    from demo.synthetic_data import synthetic_batch
    from processor.config import ModelConfig
    from processor.engine.open_group import open_session_group
    from processor.store.model_version import ModelVersion

    paths = ctr_model_small
    config = ModelConfig.from_dict(ort_config(paths, session_num=3))
    version = ModelVersion(paths.steps[-1], -1, full_prefix=str(paths.latest_checkpoint_prefix),
                           savedmodel_dir=str(paths.savedmodel_dir))
    group = open_session_group(config, version)
    backend = group.backend
    try:
        rng = np.random.default_rng(0)
        kernel = rng.normal(size=backend.variables["mlp/layer_1/kernel"].shape).astype(np.float32) * 0.05
        rows = np.arange(0, 100, 3, dtype=np.int64)
        table = rng.normal(size=(len(rows), 16)).astype(np.float32)
        bias = np.array([0.25], np.float32)
        backend.update_parameter("mlp/layer_1/kernel", kernel)
        backend.update_parameter("embeddings/C1", table, rows)
        backend.update_parameter("mlp/output/bias", bias)
        feeds = synthetic_batch(32, 11)
        feeds["sparse_ids"][:, 0] = rows[np.arange(32) % len(rows)]
        got = [group.run_on(lane, feeds, ("logits",))[0] for lane in range(3)]

        graph = tf.Graph()
        with tf.compat.v1.Session(graph=graph) as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(paths.savedmodel_dir))
            sess.run(meta.saver_def.restore_op_name,
                     {meta.saver_def.filename_tensor_name: str(paths.latest_checkpoint_prefix)})
            with graph.as_default():
                handles = {n: graph.get_operation_by_name(n).outputs[0]
                           for n in ("mlp/layer_1/kernel", "embeddings/C1", "mlp/output/bias")}
                sess.run([tf.raw_ops.AssignVariableOp(resource=handles["mlp/layer_1/kernel"], value=kernel),
                          tf.raw_ops.ResourceScatterUpdate(resource=handles["embeddings/C1"], indices=rows,
                                                           updates=table),
                          tf.raw_ops.AssignVariableOp(resource=handles["mlp/output/bias"], value=bias)])
            sig = meta.signature_def["serving_default"]
            want = sess.run(sig.outputs["logits"].name, {sig.inputs[k].name: v for k, v in feeds.items()})
        for lane_output in got:
            np.testing.assert_allclose(lane_output, want, rtol=0, atol=1e-5)
        with pytest.raises(ValueError):
            backend.update_parameter("embeddings/C1", table, rows + 10_000)
    finally:
        group.close()


def test_delta_is_applied_in_place(toy_model):
    from processor.checkpoint.delta import Delta
    from processor.config import ModelConfig
    from processor.engine.open_group import open_session_group
    from processor.store.model_version import ModelVersion

    config = ModelConfig.from_dict(ort_config(toy_model, session_num=2))
    version = ModelVersion(1, -1, full_prefix=str(toy_model.latest_checkpoint_prefix),
                           savedmodel_dir=str(toy_model.savedmodel_dir))
    group = open_session_group(config, version)
    try:
        assert set(group.backend.variables) >= {"a", "b"}
        group.backend.apply_delta(Delta(2, dense={"a": np.array(2.0, np.float32)}))
        assert [group.run_on(lane, X1, ("y",))[0].tolist() for lane in range(2)] == [[[4.0]], [[4.0]]]
    finally:
        group.close()


def test_mismatch_against_tensorflow_fails_the_load(toy_model, monkeypatch, tmp_path):
    from processor.engine.onnx import check as onnx_check

    monkeypatch.setenv("SP_ONNX_CACHE_DIR", str(tmp_path / "fresh"))
    monkeypatch.setattr(onnx_check, "ATOL", -1.0)  # nothing can pass
    with pytest.raises(Internal) as err:
        abi.initialize("", json.dumps(ort_config(toy_model)))
    assert "does not match TensorFlow" in err.value.message and "'y'" in err.value.message
    assert not list((tmp_path / "fresh").glob("*/manifest.json"))  # nothing cached


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_gpu_config_on_this_cpu_machine_fails_clearly(toy_model, backend):
    with pytest.raises(ConfigError) as err:
        abi.initialize("", json.dumps(model_config(toy_model, backend=backend, gpu_ids_list="0",
                                                   use_multi_stream=True, session_num=2)))
    assert "no GPU is visible" in err.value.message and "gpu_fallback_to_cpu" in err.value.message


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_gpu_fallback_to_cpu_serves_and_says_so(toy_model, make_processor, backend):
    p = make_processor(model_config(toy_model, backend=backend, gpu_ids_list="0", session_num=2,
                                    use_multi_stream=True, gpu_fallback_to_cpu=True,
                                    use_per_session_threads=True))
    assert predict(p, X1)["y"].tolist() == [[2.5]]
    devices = p.model_info()["session_group"]["devices"]
    assert devices["devices"] == "cpu" and "gpu_fallback_to_cpu" in devices["note"]
