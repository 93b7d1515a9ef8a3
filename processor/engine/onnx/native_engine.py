"""The native ONNX Runtime engine: whole requests without the GIL (``native/src/ort_engine.h``).

The onnxruntime package ships the runtime as a C library (``capi/libonnxruntime.so.*``) next to
its Python binding. :func:`open_engine` builds ``processor._native.OrtEngine`` over it: one
session per ONNX Runtime session of the backend, with the same thread settings and the same
host parameter arrays (the backend's :mod:`.param_buffers`, added as initializers, so the weights
stay one copy and in-place updates reach these sessions too). Unsplit graphs only: with device
placement the two parts of a split graph run through the binding. Its ``serve(plan, lane, data)`` turns PredictRequest bytes into
PredictResponse bytes with the GIL released from the first byte to the last.

The backend keeps its Python-binding sessions: they serve what the engine does not take
(invalid requests, which get the reference errors; rare wire forms; engine errors), warm-up
and tracing. CPU lanes only: the Python binding holds a second copy of ONNX Runtime, and two
copies in one process must not both load the CUDA provider library, so GPU lanes serve through
the binding (with the native codec).

With batching configured, the native batching queue (:mod:`processor.batching.native_queue`)
runs merged batches on the engine's lanes, without Python.

Functions only; thread-safe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ... import native
from ...signature import Signature
from .. import pinning


def runtime_library() -> str | None:
    """The ONNX Runtime C library of the installed onnxruntime package, or None."""
    import onnxruntime

    found = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    return str(found[0]) if found else None


def open_engine(model_path: str, signature: Signature, parameters: dict[str, np.ndarray],
                sessions: list[tuple[bool, int, int, str, dict[str, str]]], lane_session: list[int],
                global_pools: tuple[int, int] | None, why_not: str = "") -> tuple[Any, dict[str, Any]]:
    """(engine or None, report for model info).

    ``sessions``: per session (per-session threads, intra, inter, affinities, CUDA provider
    options or {}) as the Python sessions have them; ``lane_session``: the session of every lane. ``why_not``: a reason this
    backend cannot use the engine (GPU lanes, plain string inputs), checked first.
    """
    if native.MODULE is None:
        return None, {"serving": False, "reason": native.status()["reason"]}
    if why_not:
        return None, {"serving": False, "reason": why_not}
    library = runtime_library()
    if library is None:
        return None, {"serving": False, "reason": "the onnxruntime package ships no libonnxruntime.so"}
    intra, inter = global_pools or (0, 0)
    try:
        with pinning.creation_lock, pinning.new_threads() as created:
            engine = native.MODULE.OrtEngine(
                library, model_path, list(parameters.items()), sessions, lane_session,
                [s.name for s in signature.inputs.values()], [s.name for s in signature.outputs.values()],
                intra, inter)
    except RuntimeError as exc:
        return None, {"serving": False, "reason": f"the native engine could not start: {exc}"}
    return engine, {"serving": True, "library": library, "sessions": len(sessions),
                    "threads_created": len(created),
                    "note": "requests run from bytes to bytes without the GIL; the Python-binding "
                            "sessions serve invalid and rare requests, warm-up and traces"}

