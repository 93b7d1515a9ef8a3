"""ONNX Runtime's errors of a run -> ours: what refuses the caller's input is InvalidArgument
(4xx), anything else the engine's failure, Internal. Functions only; thread-safe."""

from __future__ import annotations

import functools

from ...errors import Internal, InvalidArgument, ProcessorError


@functools.cache
def _ort_error_map() -> tuple[tuple[type[BaseException], type[ProcessorError]], ...]:
    """ONNX Runtime's exception classes (one per status code) -> our error for a failed run.

    What refuses the caller's input (a wrong rank, dtype or shape, an id out of a table's range:
    ``InvalidArgument``; a graph that cannot run these inputs: ``InvalidGraph``) is the caller's
    :class:`~processor.errors.InvalidArgument`; every other status (``Fail``, ``RuntimeException``,
    ``EngineError``, ``EPFail``, ``NotImplemented``, ...) and any other exception is the engine's
    failure, :class:`~processor.errors.Internal`.
    """
    from onnxruntime.capi import onnxruntime_pybind11_state as status

    return ((status.InvalidArgument, InvalidArgument), (status.InvalidGraph, InvalidArgument))


def engine_error(exc: Exception) -> ProcessorError:
    """The ProcessorError for an exception of ``InferenceSession.run``."""
    for ort_class, error in _ort_error_map():
        if isinstance(exc, ort_class):
            return error(f"the model rejected the input: {exc}")
    return Internal(f"ONNX Runtime: {type(exc).__name__}: {exc}")
