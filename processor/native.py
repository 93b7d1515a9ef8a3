"""The request path's native extension, ``processor._native`` (built from ``native/``).

It decodes PredictRequest bytes into numpy arrays, writes PredictResponse bytes and computes
TensorFlow's string fingerprints, releasing the GIL for the work (``native/src/module.cc``; the
bindings of the ONNX Runtime engine and the batcher are ``module_engine.cc``).
The Python code it replaces stays as the reference it is tested against and as the fallback
for what it does not take (:mod:`processor.wire_codec`).

``MODULE`` is the extension or None; ``STATUS`` says which, and why, for model info. A missing
extension is logged once, by :func:`status`, the first time a model asks; serving then runs
the Python reference, correct but slower. Importing this module reads nothing from the
environment.
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
