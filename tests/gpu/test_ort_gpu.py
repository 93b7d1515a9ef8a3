"""ONNX Runtime on a real GPU: one device copy of the weights for every session, deltas in place
on GPU lanes, placement on vs off. Skipped, with the reason, on a host without a CUDA provider,
a CUDA device or PyTorch with CUDA (``scripts/gpu_check.sh`` runs them on a GPU host).

The answers are compared with the same model on the CPU provider in this process, within the
tolerance of floats computed by other kernels.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from demo import dlrm_onnx
from processor import codec
from processor.engine.onnx.param_buffers import why_no_gpu
from sp_checks import assert_outputs_close


WHY = why_no_gpu()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"no GPU for ONNX Runtime: {WHY}")
BATCHES = (1, 256, 2048)
# GPU against CPU: ONNX Runtime's CUDA provider runs float32 matmuls in TF32 (use_tf32, on by
# default from Ampere on: a 10-bit mantissa, unit roundoff 2**-11), so an output in [0, 1] may
# differ from the CPU's by that much; an H100 measured up to 2.2e-5 on these models.
GPU_ATOL = 2.0 ** -11


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dlrm_gpu")
    dlrm_onnx.build(directory / "model.onnx", rows=20_000, dim=16)
    return directory


def _config(model_dir, **overrides) -> dict:
    return {"savedmodel_dir": str(model_dir), "backend": "onnxruntime", "use_per_session_threads": True,
            "file_system_poll_wait_seconds": 0, **overrides}


def _predict(processor, inputs):
    status, body = processor.process(codec.encode_request(inputs))
    assert status == 200, body
    return codec.decode_response(body)


@pytest.mark.parametrize("placement", [False, True])
def test_gpu_lanes_equal_the_cpu(dlrm_dir, make_processor, placement):
    cpu = make_processor(_config(dlrm_dir))
    gpu = make_processor(_config(dlrm_dir, gpu_ids_list="0", session_num=2, use_multi_stream=True,
                                 enable_device_placement_optimization=placement))
    for batch in BATCHES:
        inputs = dlrm_onnx.inputs(batch, seed=batch)
        assert_outputs_close(_predict(gpu, inputs), _predict(cpu, inputs), f"batch {batch}", atol=GPU_ATOL)
    info = gpu.model_info()["session_group"]
    assert "CUDAExecutionProvider" in info["providers"]
    places = {p["location"]: p for p in info["parameter_buffers"]}
    if placement:
        assert info["device_placement"]["tables"] == {"tables": ["cpu"]}
        assert places["cpu"]["sessions"] == 2 and places["cuda:0"]["sessions"] == 2
    else:
        assert list(places) == ["cuda:0"] and places["cuda:0"]["sessions"] == 2


def test_native_gpu_lanes_answer_as_the_binding_and_the_cpu(dlrm_dir, make_processor):
    """native_engine_gpu_lanes: wire-format requests and arrays (the other front-ends) run on the
    engine's own CUDA sessions, host inputs copied in and outputs out by ONNX Runtime, with the
    answers of the binding's GPU sessions and of the CPU."""
    from processor import native

    if native.MODULE is None:
        pytest.skip("processor._native is not built")
    cpu = make_processor(_config(dlrm_dir))
    gpu = make_processor(_config(dlrm_dir, gpu_ids_list="0", session_num=2, use_multi_stream=True,
                                 native_engine_gpu_lanes=True))
    assert gpu.model_info()["session_group"]["native_engine"]["serving"] is True
    for batch in BATCHES:
        feeds = dlrm_onnx.inputs(batch, seed=batch)
        want = _predict(cpu, feeds)
        assert_outputs_close(_predict(gpu, feeds), want, f"wire format, batch {batch}", atol=GPU_ATOL)
        with gpu.manager.acquire() as group:
            backend = group.backend
            for lane in range(group.lanes):
                got = backend.native_engine.run_arrays(lane, [(0, feeds["dense"]), (1, feeds["sparse"])], [0])
                assert got is not None, f"the engine refused batch {batch} on lane {lane}"
                binding = backend.run_binding(lane, feeds, ("prob",))
                how = f"arrays, batch {batch}, lane {lane}"
                assert_outputs_close({"prob": got[0]}, {"prob": binding[0]}, how, atol=GPU_ATOL)
                assert_outputs_close({"prob": backend.run(lane, feeds, ("prob",))[0]}, want, how, atol=GPU_ATOL)


def test_one_device_copy_is_shared_and_a_delta_reaches_every_gpu_lane(dlrm_dir, make_processor):
    gpu = make_processor(_config(dlrm_dir, gpu_ids_list="0", session_num=4, use_multi_stream=True))
    cpu = make_processor(_config(dlrm_dir))
    (place,) = gpu.model_info()["session_group"]["parameter_buffers"]
    assert place["location"] == "cuda:0" and place["sessions"] == 4
    inputs = dlrm_onnx.inputs(64, seed=5)
    ids = np.unique((inputs["sparse"] % 20_000 + np.arange(26) * 20_000).reshape(-1))[:200]
    rows = np.full((len(ids), 16), 0.125, np.float32)
    before = _predict(gpu, inputs)
    for processor in (gpu, cpu):
        with processor.manager.acquire() as group, group._gate.exclusive():
            group.backend.update_parameter("tables", rows, ids)
    with gpu.manager.acquire() as group:
        np.testing.assert_array_equal(group.backend.read_parameter("tables")[ids], rows)
        answers = [group.run_on(lane, inputs, ("prob",))[0] for lane in range(4)]
    want = _predict(cpu, inputs)["prob"]
    assert not np.allclose(answers[0], before["prob"])
    for lane_answer in answers:
        np.testing.assert_allclose(lane_answer, want, rtol=0, atol=GPU_ATOL)


def test_buffers_are_released_after_the_group_closes(dlrm_dir):
    import json

    import torch

    from processor.processor import Processor

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(0)
    gpu = Processor.create("", json.dumps(_config(dlrm_dir, gpu_ids_list="0", session_num=2, use_multi_stream=True)))
    with gpu.manager.acquire() as group:
        buffers = group.backend._parameters.sets[0]
    assert torch.cuda.memory_allocated(0) - base >= buffers.nbytes
    del group
    gpu.close()
    gc.collect()
    assert buffers.released and torch.cuda.memory_allocated(0) == base
