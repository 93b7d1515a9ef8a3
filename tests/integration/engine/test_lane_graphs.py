"""Per-lane graph copies (lane_graphs), run without a GPU: lanes on virtual CPU devices.

The backend takes the same path for lanes on virtual CPU devices (``/device:CPU:k``,
``ConfigProto.device_count``) as for lanes on (virtual) GPUs: one copy of the serving graph per
device, pinned to it, all copies sharing the variables of copy 0.
"""

import numpy as np
import pytest

from conftest import LoadedModel, model_config, plain_tf_predict
from processor import codec
from processor.engine import device_plan as gpu
from sp_checks import assert_outputs_close, concurrent_mismatches

X1 = {"x": np.array([[1.0]], np.float32)}


def _plan(*devices: int) -> gpu.DevicePlan:
    """Lane i on /device:CPU:<devices[i]>."""
    return gpu.DevicePlan(tuple(gpu.LaneDevice(i, None, 0, f"/device:CPU:{d}", i) for i, d in enumerate(devices)),
                          (), False)


def _group(paths, plan: gpu.DevicePlan, **overrides):
    from processor.config import ModelConfig
    from processor.engine.session_group import SessionGroup
    from processor.engine.tensorflow.backend import TensorFlowBackend
    from processor.store.model_version import ModelVersion

    config = ModelConfig.from_dict(model_config(paths, session_num=len(plan.lanes), **overrides))
    version = ModelVersion(paths.steps[-1], -1, full_prefix=str(paths.latest_checkpoint_prefix),
                           savedmodel_dir=str(paths.savedmodel_dir))
    from processor.features import open_feature_store

    features = open_feature_store(config, "lanes")  # None unless the config asks for a store
    backend = TensorFlowBackend.open(config, version, lanes=len(plan.lanes), devices=plan, features=features)
    return SessionGroup(backend, config.select_session_policy, version, 0.0)


@pytest.fixture
def virtual_cpu_lanes(monkeypatch):
    """Processors built in this test put lane k on /device:CPU:k (the GPU lanes' path)."""
    monkeypatch.setattr(gpu, "plan_for", lambda config, engine: gpu.virtual_cpu_plan(config.session_num))


# --- copies in the graph: devices, step stats, predictions, one set of variables ----------------

def _copy_ops(graph, scope: str, op_type: str):
    ops = [op for op in graph.get_operations() if op.type == op_type]
    if scope:
        return [op for op in ops if op.name.startswith(scope)]
    return [op for op in ops if not op.name.startswith("processor_lane_")]


def _devices_of_copy(ran: dict[str, str], scope: str) -> dict[str, str]:
    """The ops of one copy that ran (runtime-internal _arg/_retval/_Send/_Recv left out): short device."""
    def mine(name: str) -> bool:
        return name.startswith(scope) if scope else not name.startswith("processor_lane_")

    return {n: d.split("/")[-1] for n, d in ran.items() if not n.startswith("_") and mine(n)}


def _ran_on(step_stats_bytes: bytes) -> dict[str, str]:
    from tensorflow.core.framework import step_stats_pb2

    stats = step_stats_pb2.StepStats.FromString(step_stats_bytes)
    return {n.node_name: d.device for d in stats.dev_stats for n in d.node_stats}


@pytest.mark.parametrize("placement_on", [True, False], ids=["placement", "no-placement"])
def test_ctr_lanes_run_their_own_copy_on_their_device(ctr_model_small, placement_on):
    """Lanes 0, 1, 2 on CPU:1, CPU:2, CPU:3 (CPU:0 is 'the CPU' of the placement plan)."""
    from demo.synthetic_data import synthetic_batch

    group = _group(ctr_model_small, _plan(1, 2, 3), enable_device_placement_optimization=placement_on,
                   use_per_session_threads=True)
    backend = group.backend
    graph = backend._graph
    try:
        scopes = [c.scope for c in backend._lanes.copies]
        assert scopes[0] == "" and scopes[1:] == ["processor_lane_1/", "processor_lane_2/"]
        tables = "/device:CPU:0" if placement_on else "/device:CPU:1"  # the plan's CPU, or copy 0's device
        for lane, scope in enumerate(scopes):
            matmuls = _copy_ops(graph, scope, "MatMul")
            gathers = _copy_ops(graph, scope, "ResourceGather")
            assert len(matmuls) >= 3 and len(gathers) == 26
            assert {op.device for op in matmuls} == {f"/device:CPU:{lane + 1}"}
            assert {op.device for op in gathers} == {tables}  # lookups run where their table lives
            if placement_on:
                assert {op.device for op in _copy_ops(graph, scope, "StringToHashBucketFast")} == {"/device:CPU:0"}

        feeds = synthetic_batch(16, 5)
        want = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)
        for lane, scope in enumerate(scopes):
            outputs, trace = backend.run_traced(lane, feeds, ("logits", "probability"))
            assert_outputs_close({"logits": outputs[0], "probability": outputs[1]},
                                 {k: want[k] for k in ("logits", "probability")}, f"lane {lane}")
            ran = _devices_of_copy(_ran_on(trace.step_stats), scope)
            lane_device = f"device:CPU:{lane + 1}"
            # Grappler fuses MatMul+BiasAdd(+Relu) and keeps the last op's name: check the sinks.
            relus = [op.name for op in _copy_ops(graph, scope, "Relu")]
            assert relus and {ran[n] for n in relus} == {lane_device}
            assert ran[scope + "logits"] == lane_device
            # Everything else of the copy ran on the lane's device, the tables' device or the
            # variables' (copy 0's: dense reads happen there and the values are sent over).
            assert set(ran.values()) <= {lane_device, tables.lstrip("/"), "device:CPU:1"}
            gathers = [op.name for op in _copy_ops(graph, scope, "ResourceGather") if op.name in ran]
            assert len(gathers) == 26 and {ran[n] for n in gathers} == {tables.lstrip("/")}
            others = [s for s in scopes if s and s != scope]
            assert not [n for n in _ran_on(trace.step_stats) if n.startswith(tuple(others))], \
                "no op of another lane's copy ran"

        # One set of variables: copies add no handle ops; the plain model has as many.
        plain = LoadedModel(ctr_model_small.savedmodel_dir)
        try:
            want_handles = sorted(op.name for op in plain.graph.get_operations() if op.type == "VarHandleOp")
        finally:
            plain.close()
        handles = sorted(op.name for op in graph.get_operations() if op.type == "VarHandleOp")
        assert handles == want_handles and not any(h.startswith("processor_lane_") for h in handles)
        assert set(backend.variables) == set(want_handles)

        info = group.describe()["devices"]["lane_graphs"]
        assert info["graph_copies"] == 3
        assert [(lane["lane"], lane["graph_copy"], lane["dense_device"]) for lane in info["lanes"]] == [
            (0, 0, "/device:CPU:1"), (1, 1, "/device:CPU:2"), (2, 2, "/device:CPU:3")]
        assert {lane["embedding_device"] for lane in info["lanes"]} == {tables}
        for copy in info["copies"]:
            assert copy["op_devices"][copy["dense_device"]] > 0
        placement = group.describe()["device_placement"]
        assert placement["enabled"] is placement_on
        if placement_on:
            assert placement["applied"] and placement["dense_device_per_copy"] == [
                "/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]
    finally:
        group.close()


def test_a_delta_applied_once_reaches_every_lane(ctr_model_small):
    from demo.synthetic_data import synthetic_batch
    from processor.checkpoint.delta import Delta

    group = _group(ctr_model_small, gpu.virtual_cpu_plan(3))
    try:
        rows = np.arange(0, 100, 3, dtype=np.int64)
        feeds = synthetic_batch(32, 11)
        feeds["sparse_ids"][:, 0] = rows[np.arange(32) % len(rows)]
        before = [group.run_on(lane, feeds, ("logits",))[0] for lane in range(3)]
        rng = np.random.default_rng(0)
        table = rng.normal(size=(len(rows), 16)).astype(np.float32)
        bias = np.array([0.25], np.float32)
        group.apply_delta(Delta(9, rows={"embeddings/C1": (rows, table)}, dense={"mlp/output/bias": bias}),
                          group.version)
        after = [group.run_on(lane, feeds, ("logits",))[0] for lane in range(3)]
        assert not np.allclose(before[0], after[0])
        model = LoadedModel(ctr_model_small.savedmodel_dir)
        try:
            model.restore(ctr_model_small.latest_checkpoint_prefix)
            import tensorflow as tf

            with model.graph.as_default():
                c1 = model.graph.get_operation_by_name("embeddings/C1").outputs[0]
                b = model.graph.get_operation_by_name("mlp/output/bias").outputs[0]
                model.session.run([tf.raw_ops.ResourceScatterUpdate(resource=c1, indices=rows, updates=table),
                                   tf.raw_ops.AssignVariableOp(resource=b, value=bias)])
            want = model.run(feeds)["logits"]
        finally:
            model.close()
        for lane_output in after:
            assert_outputs_close({"logits": lane_output}, {"logits": want}, "lane after the update")
    finally:
        group.close()


# --- the SessionGroup contract through process() on virtual CPU lanes ---------------------------

@pytest.mark.parametrize("overrides", [
    {"session_num": 3, "select_session_policy": "RR"},
    {"session_num": 2, "use_per_session_threads": True, "select_session_policy": "MOD"},
    {"session_num": 2, "enable_inline_execute": True},
    {"session_num": 2, "use_per_session_threads": True, "cpusets": "0;0"},
])
def test_toy_session_group_settings_on_virtual_cpu_lanes(toy_model, make_processor, virtual_cpu_lanes, overrides):
    p = make_processor(model_config(toy_model, **overrides))
    for _ in range(6):
        status, body = p.process(codec.encode_request(X1))
        assert status == 200 and codec.decode_response(body)["y"].tolist() == [[2.5]]
    group = p.model_info()["session_group"]
    lanes = overrides["session_num"]
    assert group["session_num"] == lanes and group["devices"]["lane_graphs"]["graph_copies"] == lanes
    assert [lane["dense_device"] for lane in group["devices"]["lane_graphs"]["lanes"]] == [
        f"/device:CPU:{k}" for k in range(lanes)]


@pytest.mark.parametrize("tf2", [False, True], ids=["tf1-export", "tf2-export"])
def test_toy_dense_delta_reaches_every_copy(toy_model, toy_model_tf2, tf2):
    from processor.checkpoint.delta import Delta

    paths = toy_model_tf2 if tf2 else toy_model
    group = _group(paths, gpu.virtual_cpu_plan(3))
    try:
        assert [group.run_on(k, X1, ("y",))[0].tolist() for k in range(3)] == [[[2.5]]] * 3
        name = next(n for n in group.backend.variables if n.split("/")[0] == "b")
        group.apply_delta(Delta(2, dense={name: np.array(10.0, np.float32)}), group.version)
        assert [group.run_on(k, X1, ("y",))[0].tolist() for k in range(3)] == [[[10.5]]] * 3
        handles = [op for op in group.backend._graph.get_operations() if op.type == "VarHandleOp"]
        assert not any(op.name.startswith("processor_lane_") for op in handles)
    finally:
        group.close()


@pytest.mark.parametrize("policy", ["RR", "MOD"])
def test_ctr_concurrency_on_virtual_cpu_lanes(ctr_model_small, make_processor, virtual_cpu_lanes, policy):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(model_config(ctr_model_small, session_num=4, use_per_session_threads=True,
                                    select_session_policy=policy, enable_device_placement_optimization=True))
    feeds = synthetic_batch(4, 0)
    status, body = p.process(codec.encode_request(feeds))
    want = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)
    assert_outputs_close({"logits": codec.decode_response(body)["logits"]}, {"logits": want["logits"]})
    requests = [codec.encode_request(synthetic_batch(4, seed)) for seed in range(8)]
    assert concurrent_mismatches(p.process, requests, threads=8, calls=100) == []


def test_store_served_embeddings_on_virtual_cpu_lanes(ctr_model_small):
    """Split run (key tensors, store lookup, rest of the graph) on each lane's own copy."""
    from demo.synthetic_data import synthetic_batch

    group = _group(ctr_model_small, gpu.virtual_cpu_plan(2), ev_storage_type=1,
                   enable_device_placement_optimization=True)
    try:
        assert group.describe()["embedding"]["served_from"] == "feature store"
        feeds = synthetic_batch(32, 21)
        want = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)
        for lane in range(2):
            outputs, trace = group.backend.run_traced(lane, feeds, ("logits",))
            assert_outputs_close({"logits": outputs[0]}, {"logits": want["logits"]}, f"lane {lane}")
            scope = group.backend._lanes.copies[lane].scope
            ran = _devices_of_copy(_ran_on(trace.step_stats), scope)
            relus = [op.name for op in _copy_ops(group.backend._graph, scope, "Relu")]
            assert relus and {ran[n] for n in relus} == {f"device:CPU:{lane}"}
            assert not [n for n in ran if "embedding_lookup/" in n], "the fed gathers do not run"
    finally:
        group.close()
