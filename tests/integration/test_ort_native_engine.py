"""The native ONNX Runtime engine (whole requests without the GIL) against the binding path.

Every answer the engine gives must be the one the Python-binding sessions give through the
reference codec, byte for byte; every request it does not take must still get the reference
answer or error; in-place parameter updates must reach its sessions. Arrays (the front-ends
other than our wire format) run on it too, with the binding's outputs and errors.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from demo import dlrm_onnx
from processor import codec, native

pytestmark = pytest.mark.skipif(native.MODULE is None, reason="processor._native is not built")


def _config(model_dir, **overrides) -> dict:
    return {"savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1,
            "inter_op_parallelism_threads": 1, "file_system_poll_wait_seconds": 0, **overrides}


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dlrm")
    dlrm_onnx.build(directory / "model.onnx", rows=1000, dim=8)
    return directory


def _reference(processor, data: bytes) -> tuple[int, bytes]:
    """What the binding path answers: reference decode, the lane's binding session, encode."""
    with processor.manager.acquire() as group:
        try:
            feeds, keys, aliases = group.codec.decode(data)
            arrays = group.backend.run_binding(0, feeds, aliases)
        except Exception as exc:  # noqa: BLE001 - the error is what is compared
            return exc.code.value, str(exc).encode()
        return 200, codec.encode_response(dict(zip(keys, arrays)))


def test_engine_serves_and_equals_the_binding_path(dlrm_dir, make_processor):
    p = make_processor(_config(dlrm_dir))
    assert p.model_info()["session_group"]["native_engine"]["serving"] is True
    with p.manager.acquire() as group:
        served = group._wire_server
        for batch in (0, 1, 5, 300):
            inputs = dlrm_onnx.inputs(batch, seed=batch)
            for output_filter in (None, ["prob"], ["prob", "prob"]):
                data = codec.encode_request(inputs, output_filter)
                status, body = p.process(data)
                assert (status, body) == _reference(p, data)
                for lane in range(group.lanes):
                    taken = served(lane, data)
                    assert taken is None if output_filter == ["prob", "prob"] else taken == body


def test_the_timed_path_answers_as_serve_and_times_its_stages(dlrm_dir, make_processor):
    """serve_timed (a request OpenTelemetry sampled): serve's bytes, and stage times in order
    within the call's wall clock; a request the engine does not take is None, as serve's."""
    import time

    p = make_processor(_config(dlrm_dir))
    with p.manager.acquire() as group:
        for batch in (0, 1, 7):
            data = codec.encode_request(dlrm_onnx.inputs(batch, seed=batch))
            before = time.time_ns()
            out, (start, decoded, ran, encoded, rows), lane = group.serve_timed(data)
            after = time.time_ns()
            assert out == group.serve(data) and lane in range(group.lanes)
            assert before <= start <= decoded <= ran <= encoded <= after
            assert rows == batch
        assert group.serve_timed(b"\x00garbage") is None


def test_requests_the_engine_does_not_take_get_the_reference_answer(dlrm_dir, make_processor):
    p = make_processor(_config(dlrm_dir))
    good = dlrm_onnx.inputs(3)
    cases = [b"\x00garbage", codec.encode_request({"dense": good["dense"]}),
             codec.encode_request({**good, "sparse": good["sparse"].astype(np.int32)}),
             codec.encode_request({**good, "dense": np.zeros((3, 4), np.float32)}),
             codec.encode_request(good, ["nope"])]
    for data in cases:
        status, body = p.process(data)
        assert status == 400 and (status, body) == _reference(p, data), body


def test_engine_errors_are_the_binding_errors(tmp_path, make_processor):
    """A Gather out of range fails in ONNX Runtime; the answer is the binding path's."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", 3])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "model.onnx"))
    p = make_processor(_config(tmp_path))
    ok = codec.encode_request({"ids": np.array([3, 0], np.int64)})
    assert p.process(ok) == (200, codec.encode_response({"rows": np.array([[9, 10, 11], [0, 1, 2]], np.float32)}))
    bad = codec.encode_request({"ids": np.array([7], np.int64)})
    status, body = p.process(bad)
    assert status != 200 and (status, body) == _reference(p, bad), body


def test_arrays_run_on_the_engine_as_on_the_binding(dlrm_dir, make_processor):
    from processor.errors import ProcessorError

    p = make_processor(_config(dlrm_dir))
    with p.manager.acquire() as group:
        backend, engine = group.backend, group.backend.native_engine
        for batch in (0, 1, 5, 300):
            feeds = dlrm_onnx.inputs(batch, seed=batch)
            for lane in range(group.lanes):
                want = backend.run_binding(lane, feeds, ("prob",))
                got = engine.run_arrays(lane, [(0, feeds["dense"]), (1, feeds["sparse"])], [0])
                assert [(a.dtype, a.shape, a.tobytes()) for a in got] == [(w.dtype, w.shape, w.tobytes()) for w in want]
                assert [a.tobytes() for a in backend.run(lane, feeds, ("prob",))] == [w.tobytes() for w in want]
        feeds = dlrm_onnx.inputs(4)
        refused = [[(0, feeds["dense"][:, ::2]), (1, feeds["sparse"])],  # not contiguous
                   [(0, feeds["dense"].astype(">f4")), (1, feeds["sparse"])],  # byte-swapped
                   [(0, feeds["dense"]), (1, feeds["sparse"].astype(object))],  # not fed by the engine
                   [(0, feeds["dense"]), (1, feeds["sparse"].astype(np.int32))],  # refused by ONNX Runtime
                   [(0, np.zeros((4, 3), np.float32)), (1, feeds["sparse"])],  # a shape it refuses
                   [(5, feeds["dense"])]]  # no such input
        for inputs in refused:
            assert engine.run_arrays(0, inputs, [0]) is None
        assert engine.run_arrays(0, [(0, feeds["dense"]), (1, feeds["sparse"])], [3]) is None
        bad = {**feeds, "dense": np.zeros((4, 3), np.float32)}
        with pytest.raises(ProcessorError) as on_engine:
            backend.run(0, bad, ("prob",))
        with pytest.raises(ProcessorError) as on_binding:
            backend.run_binding(0, bad, ("prob",))
        assert str(on_engine.value) == str(on_binding.value)


def test_parameter_updates_reach_the_engine(dlrm_dir, make_processor):
    p = make_processor(_config(dlrm_dir))
    data = codec.encode_request(dlrm_onnx.inputs(64))
    before = p.process(data)
    with p.manager.acquire() as group:
        table = group.backend.read_parameter("tables")  # a processor-owned parameter (the big ones are)
        group.backend.update_parameter("tables", table[:50] + 1.0, np.arange(50, dtype=np.int64))
        group.backend.update_parameter("top_w1", group.backend.read_parameter("top_w1") * 2.0)
    after = p.process(data)
    assert after[0] == 200 and after != before and after == _reference(p, data)


def test_threads_get_the_same_answers(dlrm_dir, make_processor):
    p = make_processor(_config(dlrm_dir, session_num=3, select_session_policy="RR"))
    requests = [codec.encode_request(dlrm_onnx.inputs(b, seed=b)) for b in (1, 7, 64)]
    expected = [_reference(p, r) for r in requests]
    failures = []

    def worker() -> None:
        for i in range(300):
            k = i % len(requests)
            if p.process(requests[k]) != expected[k]:
                failures.append(k)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_model_info_says_why_the_engine_does_not_serve(toy_model, make_processor):
    from conftest import model_config

    p = make_processor(model_config(toy_model, backend="tensorflow"))
    assert "native_engine" not in p.model_info()["session_group"]  # a TensorFlow group: not its engine
    from processor.engine.onnx import native_engine as ort_native

    engine, report = ort_native.open_engine("x.onnx", None, {}, [], [], None, why_not="GPU lanes serve elsewhere")
    assert engine is None and report == {"serving": False, "reason": "GPU lanes serve elsewhere"}
