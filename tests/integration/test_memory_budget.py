"""The fit check before a load (processor/memory_budget.py) with real ONNX Runtime versions: a new
full version that would not fit ``memory_limit`` is refused by name before it is read, the
version serving keeps answering every request, the refusal shows in model info and is retried;
once memory allows, the same version loads. Version memory is counted per part in model info.
"""

import json

import numpy as np
import pytest

import sp_checks
from demo import dlrm_onnx
from processor import codec, memory
from processor.memory_budget import INITIAL_FACTOR, LoadRefused, MemoryBudget
from processor.served_model import ServedModel
from processor.config import ModelConfig

POLL = 0.2
MIB = 1 << 20


def config(base) -> ModelConfig:
    # per-session pools: global ones, once made, would be in force for every later test in this process
    return ModelConfig.from_dict({"savedmodel_dir": str(base), "backend": "onnxruntime", "use_per_session_threads": True,
                                  "file_system_poll_wait_seconds": POLL})


def test_a_version_that_would_not_fit_is_refused_and_the_served_one_keeps_serving(tmp_path):
    base = tmp_path / "dlrm"
    dlrm_onnx.build(base / "1" / "model.onnx", rows=2000, dim=8, seed=1)
    budget = MemoryBudget(memory.process_rss_bytes() + 100 * MIB)
    model = ServedModel.compose("dlrm", config(base), budget=budget)
    model.start()
    try:
        request = codec.encode_request(dlrm_onnx.inputs(2, seed=3))
        with model.manager.acquire() as group:
            want = codec.decode_response(group.serve(request))["prob"]
        parts = model.info()["memory"]["1"]
        assert set(parts) == {"weights", "tables", "caches", "shared", "device"} and parts["weights"] > 0

        staging = tmp_path / "staging"
        dlrm_onnx.build(staging / "model.onnx", rows=100_000, dim=16, seed=2)  # ~160 MiB of weights
        file_bytes = (staging / "model.onnx").stat().st_size
        assert file_bytes * INITIAL_FACTOR > 100 * MIB
        staging.rename(base / "2")

        def refused():
            failed = model.info()["failed_versions"]
            return failed and "would not fit the memory limit" in failed[0]["error"]
        assert sp_checks.wait_for(refused, timeout=30), model.info()["failed_versions"]
        error = model.info()["failed_versions"][0]
        assert error["version"] == "2" and "model 'dlrm' version 2" in error["error"], error
        assert budget.refused >= 1
        for _ in range(20):  # version 1 answers every request
            with model.manager.acquire() as group:
                np.testing.assert_allclose(codec.decode_response(group.serve(request))["prob"], want, rtol=1e-6)
        assert [v["version"] for v in model.info()["versions"]] == [1]

        budget.limit = None  # memory allows now: the retry loads it
        assert sp_checks.wait_for(lambda: [v["version"] for v in model.info()["versions"]] == [2], timeout=60)
    finally:
        model.close()


def test_the_factor_is_learned_from_large_loads_only():
    budget = MemoryBudget(0)
    assert budget.limit is None and budget.factor("onnxruntime") == INITIAL_FACTOR
    budget.learn("onnxruntime", 1 * MIB, 500 * MIB)  # a small model: mostly the engine's start-up
    assert budget.factor("onnxruntime") == INITIAL_FACTOR
    budget.learn("onnxruntime", 100 * MIB, 150 * MIB)
    budget.learn("onnxruntime", 100 * MIB, 130 * MIB)
    assert budget.factor("onnxruntime") == pytest.approx(1.4)
    assert budget.factor("tensorflow") == INITIAL_FACTOR
    budget.limit = memory.process_rss_bytes() + 10 * MIB
    with pytest.raises(LoadRefused, match=r"model 'm' version 7: not loaded.*memory_limit"):
        budget.admit("m", "7", "onnxruntime", 100 * MIB)
    assert json.dumps(budget.describe())
