"""The native extension, ``processor._native`` (built from ``native/`` by scripts/build_native.sh).

What it holds, each part releasing the GIL for its work:

* the wire codec (``native/src/module.cc``): PredictRequest bytes to numpy arrays, PredictResponse
  bytes from arrays, TensorFlow's string fingerprints;
* the ONNX Runtime engine and the batching queue (``module_engine.cc``; used through
  :mod:`processor.engine.onnx.native_engine`, :mod:`processor.batching.native_queue` and
  :mod:`processor.batching.budget`);
* the embedding stores' row lookups and row cache (``module_store.cc``; through
  :mod:`processor.features.native_rows`).

The Python code each part replaces stays the reference it is tested against and the fallback
when the extension is not built (:mod:`processor.wire_codec`, the Python batcher and row budget,
``DramTable.lookup_reference``); the ONNX Runtime engine has none: without the extension those
models run on ONNX Runtime's Python sessions.

``MODULE`` is the extension or None; :func:`status` says which, and why, for model info, and
logs a missing extension once, the first time a model asks; serving then runs the Python
reference, correct but slower. Importing this module reads nothing from the environment.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

try:
    from . import _native as MODULE
    _REASON = ""
except ImportError as exc:  # not built for this interpreter
    MODULE = None
    _REASON = (f"processor._native is not built for this Python ({exc}); the request path runs the "
               f"slower Python reference codec. Build it with scripts/build_native.sh")

_warned = threading.Event()


def status() -> dict[str, Any]:
    """Whether the native codec serves, for model info; logs a warning once when it does not."""
    if MODULE is None:
        if not _warned.is_set():
            _warned.set()
            log.warning("%s", _REASON)
        return {"native": False, "reason": _REASON}
    return {"native": True, "module": MODULE.__file__,
            "release_gil_from_bytes": MODULE.RELEASE_GIL_BYTES}
