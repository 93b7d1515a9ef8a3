"""ONNX Runtime profiles -> :class:`~processor.tracing.TraceEvent`: per-op traces of one call.

ORT profiles whole sessions: ``SessionOptions.enable_profiling`` starts the profiler when the
session is created, every run appends events, and ``InferenceSession.end_profiling()`` writes
them as a JSON file (Chrome-trace-like) and stops the profiler for good (measured with 1.31.1:
a second ``end_profiling`` returns ``""``; no API starts it again). So a traced call runs on a
fresh profiling session of its own (:meth:`OnnxRuntimeBackend.run_traced`), and this module
reads the file it leaves.

The profile's records (``ph: "X"``, ``ts`` / ``dur`` in microseconds since the profiler
started): category ``Session`` (``model_loading_uri``, ``session_initialization``, one
``model_run`` per run, executor spans) and ``Node``, one ``<node>_kernel_time`` per executed
node with ``args.op_name`` (op type) and ``args.provider``; ``tid`` is the kernel thread id.
Node names are those of the optimized graph the sessions run: most are the model's ONNX node
names, fused nodes get new ones (``MatMul/MatMulAddFusion``, op ``Gemm``).

Clock: ``get_profiling_start_time_ns()`` is the profiler's start on ``system_clock``, which is
the Unix epoch on Linux (libstdc++'s ``high_resolution_clock``); where it does not look like
one (another platform's steady clock) the run's ``model_run`` record is aligned with the wall
clock taken just before the run instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from ...tracing.events import TraceEvent

log = logging.getLogger(__name__)

KERNEL_SUFFIX = "_kernel_time"
DEVICE_PREFIX = "/ort:"


def device_name(provider: str, gpu: int | None = None) -> str:
    """``/ort:CPUExecutionProvider``; a provider on a GPU lane also names the GPU."""
    if gpu is not None and provider != "CPUExecutionProvider":
        return f"{DEVICE_PREFIX}{provider}/gpu:{gpu}"
    return f"{DEVICE_PREFIX}{provider}"


def read_profile(path: str) -> list[dict[str, Any]]:
    """The records of a profile file (ValueError when it is not an ORT profile)."""
    with open(path, encoding="utf-8") as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise ValueError(f"{path}: not an ONNX Runtime profile (a JSON list of records)")
    return records


def collect(session) -> list[dict[str, Any]]:
    """End ``session``'s profiling; its records, with the file deleted. Never raises ([] then)."""
    path = ""
    try:
        path = session.end_profiling()
        return read_profile(path) if path else []
    except Exception as exc:  # noqa: BLE001 - tracing never fails a request
        log.warning("ONNX Runtime profile %r unreadable: %s: %s", path, type(exc).__name__, exc)
        return []
    finally:
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


def last_run(records: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(ts, end) of the last ``model_run`` record, in profile microseconds."""
    runs = [r for r in records if r.get("cat") == "Session" and r.get("name") == "model_run"]
    if not runs:
        raise ValueError("the ONNX Runtime profile holds no model_run record")
    run = max(runs, key=lambda r: r["ts"])
    return float(run["ts"]), float(run["ts"]) + float(run.get("dur", 0))


def origin_us(records: Sequence[dict[str, Any]], profiler_start_ns: int | None,
              run_started_ns: int) -> float:
    """Unix-epoch microseconds of the profile's ``ts == 0``.

    ``profiler_start_ns``: ``get_profiling_start_time_ns()`` when it is on the wall clock, else
    None; then the last ``model_run`` is taken to start at ``run_started_ns`` (the wall clock
    just before that run), which places it at most the Python call overhead early.
    """
    if profiler_start_ns is not None:
        return profiler_start_ns / 1000.0
    return run_started_ns / 1000.0 - last_run(records)[0]


def events(records: Sequence[dict[str, Any]], origin: float, gpu: int | None = None) -> list[TraceEvent]:
    """The ``Node`` records of the last run as TraceEvents, in start order.

    ``origin``: :func:`origin_us`. Records of earlier runs of the session (a warm-up) are left
    out: only nodes inside the last ``model_run`` span count.
    """
    start, end = last_run(records)
    out = []
    for r in records:
        if r.get("cat") != "Node" or r.get("ph", "X") != "X":
            continue
        name = str(r.get("name", ""))
        if not name.endswith(KERNEL_SUFFIX):  # older releases add _fence_before / _fence_after
            continue
        ts, dur = float(r["ts"]), float(r.get("dur", 0))
        if ts < start or ts > end:
            continue
        args = r.get("args") or {}
        node = name[: -len(KERNEL_SUFFIX)]
        out.append(TraceEvent(name=node, op=str(args.get("op_name") or node),
                              device=device_name(str(args.get("provider") or "unknown"), gpu),
                              thread=int(r.get("tid", 0)), start_us=origin + ts, duration_us=max(0.0, dur)))
    out.sort(key=lambda e: e.start_us)
    return out


def thread_names(trace_events: Sequence[TraceEvent], caller: int) -> dict[int, str]:
    """Names for the threads that ran ops: the request's own thread, or an ORT pool thread."""
    return {e.thread: ("calling thread" if e.thread == caller else f"ORT pool thread {e.thread}")
            for e in trace_events}
