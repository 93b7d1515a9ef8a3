"""A ranking request's context sent once (issue 47), on both engines: the answer is the tiled
request's; the declared context part runs once; the cache never serves a stale boundary tensor;
what a model must not broadcast is refused with a clear 400."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from processor import codec
from processor.checkpoint.delta import Delta

pytest.importorskip("onnxruntime")

SMALL = dict(items=1000, dim=8, seq=10, profile=2, profile_rows=50, profile_dim=4, user_dense=3, item_dense=2,
             user_hidden=(16, 8), item_hidden=(8, 4), head_hidden=(8, 4))
SHAPES = dict(seq=10, profile=2, user_dense=3, item_dense=2)
BACKENDS = ("tensorflow", "onnxruntime")


@pytest.fixture(scope="module")
def two_tower_dir(tmp_path_factory):
    pytest.importorskip("tensorflow")
    from demo import two_tower

    return two_tower.build(tmp_path_factory.mktemp("two_tower"), **SMALL)


def request(candidates: int, user: int = 0, seed: int = 0):
    from demo import two_tower

    return two_tower.request(candidates, user=user, seed=seed, **SHAPES)


def tiled(feeds):
    from demo import two_tower

    return two_tower.tiled(feeds)


# ONNX Runtime with per-session pools: global ones, once made, would be in force for every later
# test in this process (tests/integration/test_onnxruntime_backend.py pins sessions)
PER_SESSION = {"use_per_session_threads": True}


def config(path, backend, **extra):
    from demo import two_tower

    pools = PER_SESSION if backend == "onnxruntime" else {}
    return {"savedmodel_dir": str(path), "backend": backend, "session_num": 2,
            "context_inputs": list(two_tower.USER_INPUTS), **pools, **extra}


def answer(processor, feeds, output="prob"):
    status, body = processor.process(codec.encode_request(feeds))
    assert status == 200, body
    return codec.decode_response(body)[output]


def context_info(processor):
    with processor.manager.acquire() as group:
        return group.describe()["context"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_context_once_answers_as_the_tiled_request(two_tower_dir, make_processor, backend):
    proc = make_processor(config(two_tower_dir, backend))
    info = context_info(proc)
    part = info["context_part"]
    assert part is not None, info
    assert part["context_nodes"] > 0 and 0 < part["work_share_estimate"] < 1 and part["boundary_tensors"]
    for candidates in (1, 2, 7, 64):
        feeds = request(candidates, seed=candidates)
        np.testing.assert_allclose(answer(proc, feeds), answer(proc, tiled(feeds)), rtol=1e-5, atol=1e-6)
    info = context_info(proc)
    assert info["context_once"] == 3 and info["tiled"] == 0  # one candidate: an ordinary request
    # warmup ran the context part too (at each batch size above 1, on each lane), uncounted
    warmup = proc.model_info()["warmup"]
    assert warmup["context_runs"] == (len(warmup["batch_sizes"]) - 1) * 2 * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_undeclared_context_is_tiled_and_exact(two_tower_dir, make_processor, backend):
    cfg = config(two_tower_dir, backend)
    del cfg["context_inputs"]
    proc = make_processor(cfg)
    feeds = request(9)
    partial = {**tiled(feeds), "user_dense": feeds["user_dense"]}  # any per-row input may come as one row
    expected = answer(proc, tiled(feeds))
    np.testing.assert_allclose(answer(proc, feeds), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(answer(proc, partial), expected, rtol=1e-5, atol=1e-6)
    info = context_info(proc)
    assert info["context_part"] is None and info["tiled"] == 2 and info["context_inputs"] is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_subset_of_the_declared_context_is_tiled(two_tower_dir, make_processor, backend):
    proc = make_processor(config(two_tower_dir, backend))
    feeds = request(5)
    partial = {**tiled(feeds), "user_seq": feeds["user_seq"]}
    np.testing.assert_allclose(answer(proc, partial), answer(proc, tiled(feeds)), rtol=1e-5, atol=1e-6)
    assert context_info(proc)["tiled"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_undeclared_one_row_input_is_refused(two_tower_dir, make_processor, backend):
    proc = make_processor(config(two_tower_dir, backend))
    feeds = tiled(request(6))
    feeds["item_dense"] = feeds["item_dense"][:1]
    status, body = proc.process(codec.encode_request(feeds))
    assert status == 400
    assert b"input 'item_dense' has 1 row where the request's other inputs have 6" in body
    assert b"context_inputs ['user_dense', 'user_profile', 'user_seq']" in body
    assert context_info(proc)["refused"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_and_batched_requests_keep_the_context(two_tower_dir, make_processor, backend):
    split = make_processor(config(two_tower_dir, backend, max_execution_batch_size=4))
    batched = make_processor(config(two_tower_dir, backend, batching={"max_batch_size": 64, "batch_timeout_micros": 0}))
    feeds = request(11)
    expected = answer(split, tiled(feeds))
    np.testing.assert_allclose(answer(split, feeds), expected, rtol=1e-5, atol=1e-6)
    assert context_info(split)["context_once"] == 3  # one per chunk of at most 4 rows
    np.testing.assert_allclose(answer(batched, feeds), expected, rtol=1e-5, atol=1e-6)
    assert context_info(batched)["context_once"] == 1  # its rows disagree: it runs alone


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_cache_serves_repeated_contexts(two_tower_dir, make_processor, backend):
    proc = make_processor(config(two_tower_dir, backend, context_cache={"max_entries": 2}))
    for user in (0, 1, 0, 0, 2, 1):
        feeds = request(5, user=user, seed=user + 7)
        np.testing.assert_allclose(answer(proc, feeds), answer(proc, tiled(feeds)), rtol=1e-5, atol=1e-6)
    cache = context_info(proc)["cache"]
    assert (cache["hits"], cache["misses"], cache["entries"], cache["evictions"]) == (2, 4, 2, 2)
    assert cache["bytes"] > 0


def _user_layer(backend):
    """The checkpoint name of a user-side weight a delta rewrites (the boundary depends on it)."""
    return "user/w1"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_delta_never_serves_a_stale_boundary_tensor(two_tower_dir, make_processor, backend):
    proc = make_processor(config(two_tower_dir, backend, context_cache={"max_entries": 64}))
    users = [request(6, user=u, seed=u) for u in range(3)]
    rng = np.random.default_rng(5)
    with proc.manager.acquire() as group:
        info = group.backend.variables[_user_layer(backend)]
        steps = [rng.standard_normal(info.shape).astype(np.float32) for _ in range(4)]

    def apply(step):
        with proc.manager.acquire() as group:
            group.apply_delta(Delta(step + 2, dense={_user_layer(backend): steps[step]}), group.version)

    # the answers of every weight step, from tiled requests (no context part, no cache)
    expected = []
    for step in range(len(steps)):
        apply(step)
        expected.append([answer(proc, tiled(f)) for f in users])
    assert not np.allclose(expected[0][0], expected[1][0])
    apply(0)
    for f, want in zip(users, expected[0]):  # fill the cache at step 0
        np.testing.assert_allclose(answer(proc, f), want, rtol=1e-5, atol=1e-6)

    seen, failures, stop = [], [], threading.Event()

    def client(k):
        while not stop.is_set():
            try:
                seen.append((k, answer(proc, users[k])))
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
                return

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        for step in range(1, len(steps)):
            apply(step)
            for k, f in enumerate(users):  # the delta has landed: never the old boundary again
                np.testing.assert_allclose(answer(proc, f), expected[step][k], rtol=1e-5, atol=1e-6)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures
    for k, got in seen:  # every answer under load is one step's, whole
        assert any(np.allclose(got, expected[s][k], rtol=1e-5, atol=1e-6) for s in range(len(steps))), (k, got)
    cache = context_info(proc)["cache"]
    assert cache["invalidations"] >= len(steps) + 3 and cache["hits"] > 0


def test_a_row_mixing_op_stays_out_of_the_context_part(tmp_path, make_processor):
    """A sum over the rows after the context's layer: on the tiled request it sums N equal rows,
    so the part must stop before it (a batch-1 run would sum one)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["u", "wu"], ["ue"]), helper.make_node("Relu", ["ue"], ["ur"]),
             helper.make_node("ReduceSum", ["ur", "axes0"], ["us"], keepdims=1),
             helper.make_node("MatMul", ["i", "wi"], ["ie"]), helper.make_node("Add", ["ie", "us"], ["y"])]
    graph = helper.make_graph(
        nodes, "mixing", [helper.make_tensor_value_info("u", TensorProto.FLOAT, ["b", 4]),
                          helper.make_tensor_value_info("i", TensorProto.FLOAT, ["b", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        [numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "wu"),
         numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "wi"),
         numpy_helper.from_array(np.array([0], np.int64), "axes0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "m").mkdir()
    onnx.save(model, str(tmp_path / "m" / "model.onnx"))
    proc = make_processor({"savedmodel_dir": str(tmp_path / "m"), "context_inputs": ["u"], **PER_SESSION})
    feeds = {"u": rng.standard_normal((1, 4)).astype(np.float32), "i": rng.standard_normal((5, 3)).astype(np.float32)}
    expected = answer(proc, {**feeds, "u": np.repeat(feeds["u"], 5, axis=0)}, "y")
    np.testing.assert_allclose(answer(proc, feeds, "y"), expected, rtol=1e-5, atol=1e-5)
    part = context_info(proc)["context_part"]
    assert part["boundary_tensors"] == ["ur"]
    assert {"node": "2:ReduceSum", "op": "ReduceSum", "why": "not known to be row-wise here"} in part["stopped_at"]


def test_native_engine_leaves_broadcast_requests_to_the_exact_path(tmp_path, make_processor):
    """The DLRM-like .onnx (no declared context): a one-row ``dense`` is not run by the native
    engine's broadcasting but answered as the tiled request."""
    from demo import dlrm_onnx

    dlrm_onnx.build(tmp_path / "m" / "model.onnx", rows=500, dim=4)
    proc = make_processor({"savedmodel_dir": str(tmp_path / "m"), "session_num": 1, **PER_SESSION})
    with proc.manager.acquire() as group:
        assert group.serves_natively
    feeds = dlrm_onnx.inputs(8, seed=2)
    one = {**feeds, "dense": feeds["dense"][:1]}
    want = answer(proc, {**feeds, "dense": np.repeat(feeds["dense"][:1], 8, axis=0)})
    np.testing.assert_allclose(answer(proc, one), want, rtol=1e-6, atol=1e-7)
    assert context_info(proc)["tiled"] == 1


def test_an_event_loop_never_runs_a_broadcast_request_in_place(tmp_path, make_processor):
    """DataPlane.submit (an edge's event loop) runs only what the native engine runs; a one-row
    context goes to a thread (its exact path may take milliseconds), holding the version it was
    routed to."""
    from demo import dlrm_onnx
    from processor.dataplane import Deferred
    from processor.request import PredictResult, wire_call

    dlrm_onnx.build(tmp_path / "m" / "model.onnx", rows=500, dim=4)
    proc = make_processor({"savedmodel_dir": str(tmp_path / "m"), "session_num": 1, **PER_SESSION})
    feeds = dlrm_onnx.inputs(4, seed=2)
    one = codec.encode_request({**feeds, "dense": feeds["dense"][:1]})
    deferred = proc.dataplane.submit(wire_call(proc.name, one), 1 << 20)
    assert isinstance(deferred, Deferred)
    assert isinstance(proc.dataplane.submit(wire_call(proc.name, codec.encode_request(feeds)), 1 << 20), PredictResult)
    assert deferred.run().outputs == proc.dataplane.predict(wire_call(proc.name, one)).outputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_context_inputs_are_checked_at_load(two_tower_dir, make_processor, backend):
    from processor.errors import ProcessorError

    with pytest.raises(ProcessorError, match="context_inputs: 'nope' is not an input"):
        make_processor(config(two_tower_dir, backend, context_inputs=["nope"], init_timeout_minutes=0))
