"""Custom op libraries (the ``custom_op_libraries`` model_config key): shared objects of
TensorFlow ops a SavedModel needs (TF Recommenders-Addons' dynamic embeddings, SOK, a team's own
kernels), loaded as ``tf.load_op_library`` loads them before the SavedModel is imported.

TensorFlow registers a library's ops for the whole process and cannot unload them, so each path
is loaded once per process (later loads, by any model, reuse it). Errors are ConfigErrors naming
the key and the path: a path that is not a readable file, and a library TensorFlow refuses
(built against another TensorFlow, an undefined symbol, not a shared object), with its message.
Thread-safe (one lock around loading).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from ...echo import cut
from ...errors import ConfigError

_LOCK = threading.Lock()
_LOADED: dict[str, list[str]] = {}  # real path -> the op names it registered


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Load each library (in order) unless loaded already; what model info lists: each path
    with the ops it registered."""
    return [{"path": path, "ops": _load_one(path)} for path in paths]


def _load_one(path: str) -> list[str]:
    real = os.path.realpath(path)
    with _LOCK:
        ops = _LOADED.get(real)
        if ops is not None:
            return ops
        if not os.path.isfile(real) or not os.access(real, os.R_OK):
            raise ConfigError(f"custom_op_libraries: {cut(path, 200)} is not a readable file")
        import tensorflow as tf
        from tensorflow.core.framework import op_def_pb2
        from tensorflow.python.client import pywrap_tf_session

        # what tf.load_op_library does, minus the Python wrappers serving does not use
        try:
            handle = pywrap_tf_session.TF_LoadLibrary(real)
        except (tf.errors.OpError, OSError, RuntimeError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise ConfigError(f"custom_op_libraries: TensorFlow {tf.__version__} could not load "
                              f"{cut(path, 200)}: {cut(message, 400)}") from None
        try:
            op_list = op_def_pb2.OpList.FromString(pywrap_tf_session.TF_GetOpList(handle))
        finally:
            pywrap_tf_session.TF_DeleteLibraryHandle(handle)  # the ops stay registered
        ops = _LOADED[real] = sorted(op.name for op in op_list.op)
        return ops
