"""TensorFlow's process-wide switches that serving sets its own way, before TensorFlow starts.

``TF_ENABLE_ONEDNN_OPTS=0``: with oneDNN on (TensorFlow's default on x86), TensorFlow's large CPU
tensors come from oneDNN's allocator, a BFC pool that grows to the largest working set
it has seen and never returns a byte. Serving loads and unloads versions for as long as it runs:
with the pool, an unloaded TensorFlow version stayed resident (184 MiB kept after the unload of
a version counted at 177.5 MiB: bench_model_memory before this default), and the DRAM store's load
grew the process by 274 MiB for 177.5 counted, its checkpoint reader's buffers pooled. Without
oneDNN, TensorFlow's CPU tensors come from the system allocator: the unloaded version's memory
goes back (4 MiB kept) and each load grows the process by what it counts (0.98). Its kernels
(MatMul and the like) then run on Eigen instead (benchmarks/results/tf_onednn.md compares).

:func:`apply` sets each switch the environment does not already set, and only while TensorFlow
is not imported yet (it reads them once, when it starts): an operator who sets
``TF_ENABLE_ONEDNN_OPTS=1`` keeps oneDNN, and a host that imported TensorFlow first keeps what
it had. :func:`onednn_enabled` tells which one a running TensorFlow took. Thread-safe enough:
call :func:`apply` before any thread imports TensorFlow
(``processor.served_model.apply_environment`` does, as every model registry is composed).
"""

from __future__ import annotations

import os
import sys

DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "0"}


def apply() -> dict[str, str]:
    """Set :data:`DEFAULTS` where the environment has no value, if TensorFlow is not imported;
    returns what it set (model info's ``environment`` shows it)."""
    if "tensorflow" in sys.modules:
        return {}
    applied = {key: value for key, value in DEFAULTS.items() if key not in os.environ}
    os.environ.update(applied)
    return applied


def onednn_enabled() -> bool | None:
    """Whether the TensorFlow of this process runs on oneDNN; None if it is not imported."""
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())
