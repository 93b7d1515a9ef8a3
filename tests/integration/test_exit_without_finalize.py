"""A script that initializes models through ``processor.abi`` and exits without ``finalize``
exits cleanly and silently (issue 29): the open models are closed at exit, so no native
object is left to interpreter teardown (nanobind's "leaked instances" report)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import model_config

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import numpy as np
from processor import abi, codec
from demo import dlrm_onnx
onnx_config, tf_config = sys.argv[1], sys.argv[2]
for config, request in ((onnx_config, dlrm_onnx.inputs(4)), (tf_config, {"x": np.array([[1.0]], np.float32)})):
    handle = abi.initialize("", config)
    status, body = abi.process(handle, codec.encode_request(request))
    assert status == 200, body
print("served")
"""


def test_script_exits_silently_without_finalize(tmp_path, toy_model):
    from demo import dlrm_onnx

    dlrm_onnx.build(tmp_path / "dlrm" / "model.onnx", rows=100, dim=4)
    onnx_config = json.dumps({"savedmodel_dir": str(tmp_path / "dlrm"), "backend": "onnxruntime",
                              "session_num": 2, "use_per_session_threads": True})
    tf_config = json.dumps(model_config(toy_model, backend="tensorflow"))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, onnx_config, tf_config], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "served"
    assert "leaked" not in proc.stderr and "nanobind" not in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
