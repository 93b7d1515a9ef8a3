"""Parameter buffers on the host: the code path GPU lanes take, run on the CPU.

One buffer handed to every session (no copy), an in-place write seen by all of them at once,
deltas through the buffers on a real model, and the release order: buffers go only after the
last session that reads them.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from benchmarks.bare_engine import bare_call
from demo import dlrm_onnx
from processor.checkpoint.delta import Delta
from processor.config import ModelConfig
from processor.engine.onnx.param_buffers import BufferSet, HostMemory, Parameters
from processor.engine.open_group import open_session_group
from processor.errors import Internal
from processor.store.model_version import ModelVersion


def _lookup_model() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((8, 2), np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["rows"])], "lookup",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, 2])], [table])
    # ir_version 8: the newest onnx writes an IR an older ONNX Runtime refuses (as demo.dlrm_onnx)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _sessions(buffers: BufferSet, count: int):
    import onnxruntime as ort

    from processor.engine.onnx.ort_env import global_pools_in_force

    model, made = _lookup_model(), []
    for _ in range(count):
        options = ort.SessionOptions()
        # once a test before this one made ORT's global pools, ORT refuses sessions with their own
        options.use_per_session_threads = global_pools_in_force() is None
        buffers.add_to(options, ["table"])
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        buffers.attach(session._sess)
        made.append(session)
    return made


def test_one_buffer_is_read_by_every_session_and_written_in_place():
    table = np.arange(16, dtype=np.float32).reshape(8, 2)
    buffers = BufferSet({"table": table}, HostMemory())
    sessions = _sessions(buffers, 3)
    ids = np.array([5, 1], np.int64)
    for session in sessions:
        np.testing.assert_array_equal(session.run(None, {"ids": ids})[0], table[[5, 1]])
    buffers.write("table", np.full((1, 2), -1.0, np.float32), np.array([5]))
    assert table[5].tolist() == [-1.0, -1.0]  # the caller's array itself: no copy was made
    for session in sessions:
        assert session.run(None, {"ids": ids})[0].tolist() == [[-1.0, -1.0], [2.0, 3.0]]
    buffers.write("table", np.zeros((8, 2), np.float32))
    assert all(not s.run(None, {"ids": ids})[0].any() for s in sessions)
    assert buffers.describe() == {"location": "cpu", "parameters": 1, "mib": 0.0, "sessions": 3,
                                  "released": False}


def test_buffers_are_released_after_the_last_session():
    buffers = BufferSet({"table": np.ones((8, 2), np.float32)}, HostMemory())
    sessions = _sessions(buffers, 2)
    buffers.release()
    assert not buffers.released and buffers.live_sessions == 2  # sessions still read it
    del sessions[0]
    gc.collect()
    assert not buffers.released and buffers.live_sessions == 1
    del sessions[0]
    gc.collect()
    assert buffers.released and buffers.live_sessions == 0
    with pytest.raises(Internal, match="released"):
        buffers.write("table", np.zeros((8, 2), np.float32))


def test_parameters_keep_one_copy_per_place():
    arrays = {"a": np.ones((4, 2), np.float32), "b": np.zeros(3, np.float32)}
    params = Parameters(arrays, {None: ["a", "b"]})
    assert list(params.sets) == [None] and params.location_of("a") == ["cpu"]
    params.write("b", np.full(3, 2.0, np.float32))
    assert arrays["b"].tolist() == [2.0, 2.0, 2.0] and params.read("b").tolist() == [2.0, 2.0, 2.0]
    params.release()
    assert params.sets[None].released


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dlrm_buffers")
    dlrm_onnx.build(directory / "model.onnx", rows=200, dim=4)
    return directory


def _group(model_dir, **overrides):
    config = ModelConfig.from_dict({"savedmodel_dir": str(model_dir), "backend": "onnxruntime",
                                    "session_num": 3, "use_per_session_threads": True,
                                    "intra_op_parallelism_threads": 1, "file_system_poll_wait_seconds": 0,
                                    **overrides})
    return open_session_group(config, ModelVersion(1, -1, savedmodel_dir=str(model_dir)))


def test_backend_sessions_share_one_host_copy_and_release_it_after_close(dlrm_dir):
    group = _group(dlrm_dir)
    backend = group.backend
    (place,) = backend.describe()["parameter_buffers"]
    assert place["location"] == "cpu" and place["sessions"] == 3 and not place["released"]
    buffers = backend._parameters.sets[None]
    feeds = {"dense": dlrm_onnx.inputs(4)["dense"], "sparse": dlrm_onnx.inputs(4)["sparse"]}
    held = bare_call(backend, 1, feeds, ("prob",))  # keeps lane 1's session alive past close
    want = held()
    group.close()
    assert not buffers.released and buffers.live_sessions == 1
    np.testing.assert_array_equal(held()[0], want[0])  # its weights are still there
    del held
    gc.collect()
    assert buffers.released


@pytest.mark.parametrize("placement", [False, True])
def test_delta_through_the_buffers_reaches_every_lane(dlrm_dir, placement):
    """A delta of table rows and a dense weight, written through the buffers, on the whole graph
    and on the split one: every lane answers as a model whose weights were those from the start."""
    group = _group(dlrm_dir, enable_device_placement_optimization=placement)
    feeds = dlrm_onnx.inputs(64, seed=3)
    try:
        backend = group.backend
        assert set(backend.variables) == set()  # a plain .onnx model has no TF variables
        ids = (feeds["sparse"] % 200 + np.arange(26) * 200)[:8, 0]
        rows = np.full((len(ids), 4), 0.5, np.float32)
        top_w1 = backend.read_parameter("top_w1") * -1.0
        before = group.run_on(0, feeds, ("prob",))[0]
        with group._gate.exclusive():
            backend.update_parameter("tables", rows, ids)
            backend.update_parameter("top_w1", top_w1)
        after = [group.run_on(lane, feeds, ("prob",))[0] for lane in range(3)]
        assert not np.allclose(after[0], before)
        for lane_output in after[1:]:
            np.testing.assert_array_equal(lane_output, after[0])
        np.testing.assert_array_equal(backend.read_parameter("tables")[ids], rows)
    finally:
        group.close()
    # The same weights from the start: a model written with them.
    fresh = _group(dlrm_dir, enable_device_placement_optimization=placement)
    try:
        with fresh._gate.exclusive():
            fresh.backend.update_parameter("tables", rows, ids)
            fresh.backend.update_parameter("top_w1", top_w1)
        np.testing.assert_array_equal(fresh.run_on(2, feeds, ("prob",))[0], after[0])
    finally:
        fresh.close()


def test_ctr_delta_is_applied_through_the_buffers(ctr_model_small):
    from conftest import model_config

    paths = ctr_model_small
    config = ModelConfig.from_dict(model_config(paths, backend="onnxruntime", session_num=2,
                                                use_per_session_threads=True,
                                                enable_device_placement_optimization=True))
    version = ModelVersion(paths.steps[-1], -1, full_prefix=str(paths.latest_checkpoint_prefix),
                           savedmodel_dir=str(paths.savedmodel_dir))
    group = open_session_group(config, version)
    try:
        backend = group.backend
        assert "embeddings/C1" in backend.variables and "mlp/output/bias" in backend.variables
        rows = np.array([0, 7, 9], np.int64)
        values = np.full((3, 16), 0.25, np.float32)
        backend.apply_delta(Delta(5, rows={"embeddings/C1": (rows, values)},
                                  dense={"mlp/output/bias": np.array([1.5], np.float32)}))
        np.testing.assert_array_equal(backend.read_parameter("embeddings/C1")[rows], values)
        assert backend.read_parameter("mlp/output/bias").tolist() == [1.5]
        places = backend.describe()["device_placement"]["tables"]
        assert places["embeddings/C1:0"] == ["cpu"]
    finally:
        group.close()
