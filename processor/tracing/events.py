"""What a traced engine run reports, independent of the engine (the traced-run contract).

A backend's ``run_traced(lane, feeds, fetches)`` returns ``(outputs, EngineTrace)``. The trace
holds one :class:`TraceEvent` per executed op; an engine whose native profile already is a
TensorFlow ``StepStats`` (TensorFlow) may hand that over instead, as serialized bytes, and the
tracer writes it verbatim. See :mod:`processor.engine.backend` for the full contract.

Times are microseconds (floats allowed) since the Unix epoch, i.e. ``CLOCK_REALTIME``
(``time.time_ns() / 1000``): the same clock TensorFlow's step stats use, so engine ops and the
processor's own stages line up on one time axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TraceEvent:
    """One executed op (or one processor stage).

    ``name``: the op instance (graph node) name, e.g. ``mlp/layer_1/MatMul``;
    ``op``: the op type, e.g. ``MatMul``; ``device``: where it ran, e.g.
    ``/job:localhost/replica:0/task:0/device:CPU:0`` or ``/ort:CPUExecutionProvider``;
    ``thread``: the engine thread that ran it (any stable non-negative int per thread);
    ``start_us`` / ``duration_us``: microseconds, start since the Unix epoch.
    """

    name: str
    op: str
    device: str
    thread: int
    start_us: float
    duration_us: float


@dataclass(frozen=True)
class EngineTrace:
    """The engine's part of one traced run.

    Give ``events`` (any engine), or ``step_stats`` (a serialized ``tensorflow.StepStats``, for
    engines that produce one natively); when ``step_stats`` is set it is written as is and
    ``events`` may stay empty. ``thread_names`` optionally names engine threads
    (``thread -> name``); the tracer adds the lane to them. ``stages``: spans of the call that
    are the tracing's own cost, not serving work (``(name, start_us, duration_us)``, e.g. ONNX
    Runtime's ``trace_setup`` / ``trace_collect``); they are shown among the processor's stages,
    inside ``run``.
    """

    events: Sequence[TraceEvent] = ()
    step_stats: bytes = b""
    thread_names: dict[int, str] = field(default_factory=dict)
    stages: Sequence[tuple[str, float, float]] = ()
