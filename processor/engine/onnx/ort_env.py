"""ONNX Runtime's process-wide environment: the onnxruntime module, its global thread pools and
how a session's pool threads are pinned (:func:`intra_op_affinities`).

Shared by the backend (:mod:`.backend`, which creates the pools when a model asks for them) and
the conversion check (:mod:`.check`, whose sessions must then use them too: ONNX Runtime refuses
sessions with their own pools once the global ones exist). Neither imports the other.

Functions only; thread-safe.
"""

from __future__ import annotations

import threading

_global_pool_lock = threading.Lock()
_global_pool_sizes: tuple[int, int] | None = None


def ort():
    """The onnxruntime module, imported on first use."""
    import onnxruntime

    return onnxruntime


def ensure_global_thread_pools(intra: int, inter: int) -> tuple[int, int]:
    """Size ORT's process-wide pools once (before any session uses them); return the sizes in force.

    ORT refuses ``use_per_session_threads=False`` unless this ran first; the sizes can be set only
    once per process, so a later model asking for other sizes shares the first model's pools.
    """
    global _global_pool_sizes
    with _global_pool_lock:
        if _global_pool_sizes is None:
            ort().set_global_thread_pool_sizes(intra, inter)
            _global_pool_sizes = (intra, inter)
        return _global_pool_sizes


def global_pools_in_force() -> tuple[int, int] | None:
    """The sizes of ORT's global pools if some model created them, else None."""
    return _global_pool_sizes


def intra_op_affinities(cpus: tuple[int, ...] | list[int], threads: int) -> str:
    """``session.intra_op_thread_affinities`` pinning every pool worker to ``cpus``.

    ORT wants ``threads - 1`` entries separated by ``;`` (the calling thread is the first thread
    and is not pinned), each a comma list of 1-based logical CPU ids.
    """
    entry = ",".join(str(c + 1) for c in cpus)
    return ";".join([entry] * (threads - 1))
