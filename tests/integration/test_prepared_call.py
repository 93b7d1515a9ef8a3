"""``DataPlane.prepare`` / ``run_prepared`` on real models: a call of arrays checked once, then
run with other arrays of the same form, answers as ``predict`` does; once another version
serves the model, the prepared call runs nothing (None) and a fresh one serves the new version;
models whose calls take another path (batching, tracing) are never prepared; a call that
``predict`` refuses, ``prepare`` refuses with the same error."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from processor.errors import DeadlineExceeded, InvalidArgument
from processor.request import PredictCall


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory):
    from demo import dlrm_onnx

    directory = tmp_path_factory.mktemp("prep") / "dlrm"
    dlrm_onnx.build(directory / "model.onnx", rows=300, dim=8)
    return directory


def onnx_config(directory, **extra) -> dict:
    return {"savedmodel_dir": str(directory), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1, **extra}


def test_a_prepared_call_answers_as_predict_does(make_processor, dlrm_dir):
    from demo import dlrm_onnx

    p = make_processor(onnx_config(dlrm_dir), "dlrm")
    first, second = dlrm_onnx.inputs(4, seed=1), dlrm_onnx.inputs(4, seed=2)
    prepared = p.dataplane.prepare(PredictCall("dlrm", first))
    assert prepared is not None
    assert [(alias, dtype, shape) for alias, dtype, shape in prepared.inputs] == [
        (k, v.dtype, v.shape) for k, v in first.items()]
    for feeds in (first, second):
        got = p.dataplane.run_prepared(prepared, dict(feeds))
        want = p.dataplane.predict(PredictCall("dlrm", feeds))
        assert got.outputs.keys() == want.outputs.keys() and got.version == want.version
        for key in want.outputs:
            np.testing.assert_allclose(got.outputs[key], want.outputs[key], rtol=1e-6, atol=1e-7)
    with pytest.raises(DeadlineExceeded):
        p.dataplane.run_prepared(prepared, dict(first), deadline=0.0)


def test_what_predict_refuses_prepare_refuses_alike(make_processor, dlrm_dir):
    from demo import dlrm_onnx

    p = make_processor(onnx_config(dlrm_dir), "dlrm")
    feeds = dlrm_onnx.inputs(2, seed=3)
    bad = {**feeds, "dense": feeds["dense"].astype(np.float64)}
    with pytest.raises(InvalidArgument) as refused:
        p.dataplane.predict(PredictCall("dlrm", bad))
    with pytest.raises(InvalidArgument) as prepared:
        p.dataplane.prepare(PredictCall("dlrm", bad))
    assert str(prepared.value) == str(refused.value)
    assert p.dataplane.prepare(PredictCall("dlrm", lambda signature: feeds)) is None  # a decoder: not arrays


@pytest.mark.parametrize("extra", [
    {"batching": {"max_batch_size": 8, "batch_timeout_micros": 0}},
    {"timeline_start_step": 0, "timeline_interval_step": 1, "timeline_trace_count": 5},
])
def test_models_whose_calls_take_another_path_are_not_prepared(make_processor, dlrm_dir, tmp_path, extra):
    from demo import dlrm_onnx

    if "timeline_start_step" in extra:
        extra = {**extra, "timeline_path": str(tmp_path)}
    p = make_processor(onnx_config(dlrm_dir, **extra), "dlrm")
    assert p.dataplane.prepare(PredictCall("dlrm", dlrm_onnx.inputs(1, seed=4))) is None


def test_a_version_swap_retires_the_prepared_call(make_processor, dlrm_dir):
    from demo import dlrm_onnx

    p = make_processor(onnx_config(dlrm_dir), "dlrm")
    feeds = dlrm_onnx.inputs(2, seed=6)
    prepared = p.dataplane.prepare(PredictCall("dlrm", feeds))
    assert p.dataplane.run_prepared(prepared, dict(feeds)) is not None
    p.manager.load(p.manager.discover())  # a new group serves (the same files, loaded again)
    assert p.dataplane.run_prepared(prepared, dict(feeds)) is None
    gc.collect()
    assert prepared.group() is None  # the retired group is not kept alive by the prepared call
    again = p.dataplane.prepare(PredictCall("dlrm", feeds))
    got = p.dataplane.run_prepared(again, dict(feeds)).outputs
    want = p.dataplane.predict(PredictCall("dlrm", feeds)).outputs
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7)
