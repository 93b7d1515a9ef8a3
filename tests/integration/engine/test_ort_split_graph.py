"""Device placement on ONNX Runtime, on a CPU-only host: the graph split at its embedding lookups
(both parts on the CPU provider) answers as the whole graph, on both demo models, at batch
1 / 256 / 2048; model info shows the plan and where the tables live."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import model_config
from demo import dlrm_onnx
from processor import codec
from sp_checks import assert_outputs_close

BATCHES = (1, 256, 2048)


def _predict(processor, inputs):
    status, body = processor.process(codec.encode_request(inputs))
    assert status == 200, body
    return codec.decode_response(body)


def _pair(make_processor, config):
    whole = make_processor({**config, "enable_device_placement_optimization": False})
    split = make_processor({**config, "enable_device_placement_optimization": True})
    return whole, split


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dlrm_split")
    dlrm_onnx.build(directory / "model.onnx", rows=1000, dim=8)
    return directory


def test_dlrm_split_equals_whole(dlrm_dir, make_processor):
    whole, split = _pair(make_processor, {
        "savedmodel_dir": str(dlrm_dir), "backend": "onnxruntime", "session_num": 2,
        "use_per_session_threads": True, "file_system_poll_wait_seconds": 0})
    for batch in BATCHES:
        inputs = dlrm_onnx.inputs(batch, seed=batch)
        assert_outputs_close(_predict(split, inputs), _predict(whole, inputs), f"dlrm batch {batch}")
    info = split.model_info()["session_group"]
    plan = info["device_placement"]
    assert plan["applied"] and plan["lookups"] == 1 and plan["embedding_tables"] == ["tables"]
    assert plan["tables"] == {"tables": ["cpu"]}
    assert plan["embedding_inputs"] == ["sparse"] and plan["dense_inputs"] == ["dense"]
    assert not info["native_engine"]["serving"] and "device placement" in info["native_engine"]["reason"]
    assert [p.get("part") for p in info["pinning"]["sessions"]] == ["embedding", "dense"] * 2
    assert whole.model_info()["session_group"]["native_engine"]["serving"] is True  # unsplit: as before


def test_demo_ctr_model_split_equals_whole(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    whole, split = _pair(make_processor, model_config(ctr_model_small, backend="onnxruntime",
                                                      use_per_session_threads=True))
    for batch in BATCHES:
        inputs = synthetic_batch(batch, batch)
        assert_outputs_close(_predict(split, inputs), _predict(whole, inputs), f"ctr batch {batch}")
    plan = split.model_info()["session_group"]["device_placement"]
    assert plan["applied"] and plan["lookups"] == 26 and len(plan["tables"]) == 26
    assert all(places == ["cpu"] for places in plan["tables"].values())
    assert plan["boundary_tensors"] == 26 and plan["dense_inputs"] == ["dense:0"]


def test_split_answers_every_way_in(dlrm_dir, make_processor):
    """Arrays (the JSON front-ends' form), a filtered output, a bad request: as the whole graph."""
    whole, split = _pair(make_processor, {"savedmodel_dir": str(dlrm_dir), "backend": "onnxruntime",
                                          "use_per_session_threads": True})
    inputs = dlrm_onnx.inputs(5)
    bad = codec.encode_request({"dense": inputs["dense"][:, :3], "sparse": inputs["sparse"]})
    assert split.process(bad)[0] == whole.process(bad)[0] == 400
    status, body = split.process(codec.encode_request(inputs, ["prob"]))
    assert status == 200
    np.testing.assert_allclose(codec.decode_response(body)["prob"], _predict(whole, inputs)["prob"],
                               rtol=1e-5, atol=1e-6)


def test_a_graph_without_lookups_is_not_split(toy_model, make_processor):
    p = make_processor(model_config(toy_model, backend="onnxruntime", use_per_session_threads=True,
                                    enable_device_placement_optimization=True))
    plan = p.model_info()["session_group"]["device_placement"]
    assert plan["enabled"] and not plan["applied"] and "no embedding lookups" in plan["note"]
    assert _predict(p, {"x": np.array([[1.0]], np.float32)})["y"].tolist() == [[2.5]]


def test_a_traced_request_on_a_split_graph_shows_both_parts(dlrm_dir, make_processor):
    whole, split = _pair(make_processor, {"savedmodel_dir": str(dlrm_dir), "backend": "onnxruntime",
                                          "use_per_session_threads": True})
    inputs = dlrm_onnx.inputs(3)
    with split.manager.acquire() as group:
        _, outputs, trace = group.run_traced(inputs, ("prob",))
    ops = {event.op for event in trace.events}
    assert {"Gather", "Mod"} <= ops and "Concat" in ops  # the embedding part and the dense part
    np.testing.assert_allclose(outputs[0], _predict(whole, inputs)["prob"], rtol=1e-5, atol=1e-6)
