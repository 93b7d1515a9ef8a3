"""Tracer: which requests are traced (the ``timeline_*`` keys), and writing their traces.

Step counting follows DeepRec's ``Tracer::NeedTracing``: every predict request of the model is
one step (0-based); steps ``start, start+interval, ...`` are traced, ``count`` of them. Unlike
DeepRec, warmup runs are not steps: ``timeline_start_step`` counts served requests only, so it
does not shift with ``session_num`` (DeepRec warms up 5 x sessions) or with every full update
(DeepRec warms up again, and counts again, after each one).

A traced request is run with the engine's full tracing (:meth:`SessionGroup.run_traced`), its
stages (parse, acquire, decode, run, lane wait, encode) are timed, and the result is handed to
one writer thread, which builds the ``StepStats`` and writes ``timeline-<k>`` under
``timeline_path``. ``k`` counts the files written to that path by this process, from 0, as
DeepRec's does. A request never waits for, nor fails because of, a write: failures are counted
and logged, and traces that find the writer's queue full are dropped (and counted).

Thread-safe: any number of request threads may call :meth:`Tracer.begin` at once.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from typing import Any

from .. import shared_segments
from ..config import ModelConfig
from . import step_stats
from .events import EngineTrace, TraceEvent
from .sink import open_sink

log = logging.getLogger(__name__)

#: The device that carries the processor's own stages inside a timeline file.
PROCESSOR_DEVICE = "/processor:stages"

_QUEUE_SIZE = 64
_FILE_INDEX: dict[str, itertools.count] = {}
_FILE_INDEX_LOCK = threading.Lock()


def _next_file_index(path: str) -> int:
    """Process-wide file number per target path, so two tracers never overwrite each other."""
    with _FILE_INDEX_LOCK:
        counter = _FILE_INDEX.setdefault(path, itertools.count())
    return next(counter)


def _file_name(path: str) -> str:
    """``timeline-N``; a worker of a ``workers: N`` server puts its pid in (``timeline-<pid>-N``)
    so that the workers writing to one directory never overwrite each other's files."""
    index = _next_file_index(path)
    return f"timeline-{os.getpid()}-{index}" if shared_segments.active() is not None else f"timeline-{index}"


def now_us() -> float:
    return time.time_ns() / 1000.0


class _Stage:
    __slots__ = ("recorder", "name", "start")

    def __init__(self, recorder: TraceRecorder, name: str) -> None:
        self.recorder = recorder
        self.name = name

    def __enter__(self) -> _Stage:
        self.start = now_us()
        return self

    def __exit__(self, *exc) -> None:
        self.recorder.stages.append((self.name, self.start, now_us() - self.start))


class TraceRecorder:
    """One traced request: its step, lane, timed stages and the engine's trace.

    Used by one request thread, then handed to :meth:`Tracer.submit`.
    """

    engine_trace = True  # the engine runs with its full per-op trace (an OpenTelemetry one: not)

    def __init__(self, tracer: Tracer, step: int, ordinal: int) -> None:
        self.tracer = tracer
        self.step = step
        self.ordinal = ordinal
        self.lane: int | None = None
        self.stages: list[tuple[str, float, float]] = []  # (name, start_us, duration_us)
        self.run_window: tuple[float, float] | None = None  # (start_us, end_us) of the engine call
        self.engine: EngineTrace | None = None
        self.error: str | None = None

    def stage(self, name: str) -> _Stage:
        """``with recorder.stage("decode"): ...`` times a stage (also when it raises)."""
        return _Stage(self, name)


class _Untimed:
    """``TraceRecorder.stage``'s stand-in for an untraced call: a context that does nothing (a
    generator-based one costs a few microseconds a request, on every array request's path)."""

    __slots__ = ()

    def __call__(self, name: str) -> _Untimed:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


UNTIMED = _Untimed()  # an untraced call's stages


class Tracer:
    """One model's timeline sampling and writer. See the module doc."""

    def __init__(self, model: str, start_step: int, interval_step: int, trace_count: int,
                 path: str, **storage_options) -> None:
        self.model = model
        self.start_step = start_step
        self.interval_step = interval_step
        self.trace_count = trace_count
        self.path = path
        self._sink = open_sink(path, **storage_options)
        self._last_traced = start_step + interval_step * (trace_count - 1)
        self._step = 0
        self._lock = threading.Lock()
        self.done = False
        self._queue: queue.Queue[TraceRecorder | None] = queue.Queue(_QUEUE_SIZE)
        self._writer: threading.Thread | None = None
        self._closed = False
        self.stats = {"traced": 0, "written": 0, "write_errors": 0, "dropped": 0,
                      "last_error": None, "last_file": None, "write_ms_total": 0.0}

    @classmethod
    def from_config(cls, model: str, config: ModelConfig) -> Tracer | None:
        """The tracer the ``timeline_*`` keys ask for, or None when they are absent.

        Raises ConfigError naming ``timeline_path`` when the path cannot be created or written.
        """
        if config.timeline_path is None:
            return None
        return cls(model, config.timeline_start_step, config.timeline_interval_step,
                   config.timeline_trace_count, config.timeline_path)

    # --- request path -----------------------------------------------------------------------

    def begin(self) -> TraceRecorder | None:
        """Count one request; a recorder if this request is to be traced, else None.

        Once the last trace has been handed out, :attr:`done` is true and callers may stop
        asking (DataPlane then drops the tracer, so later requests pay nothing).
        """
        with self._lock:
            step = self._step
            if step > self._last_traced:
                self.done = True
                return None
            self._step = step + 1
            if step == self._last_traced:
                self.done = True
            if step < self.start_step or (step - self.start_step) % self.interval_step:
                return None
            self.stats["traced"] += 1
        return TraceRecorder(self, step, (step - self.start_step) // self.interval_step)

    def submit(self, recorder: TraceRecorder) -> None:
        """Queue a finished trace for writing; never blocks, never raises."""
        try:
            if self._closed:
                self._count_drop("the tracer is closed")
                return
            self._ensure_writer()
            self._queue.put_nowait(recorder)
        except queue.Full:
            self._count_drop("the writer is behind")
        except Exception:  # noqa: BLE001 - tracing never fails a request
            log.exception("%s: could not queue trace of step %d", self.model, recorder.step)

    def _count_drop(self, why: str) -> None:
        with self._lock:
            self.stats["dropped"] += 1
        log.warning("%s: timeline trace dropped: %s", self.model, why)

    # --- writer -----------------------------------------------------------------------------

    def _ensure_writer(self) -> None:
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                    name=f"timeline-writer-{self.model}")
                    self._writer.start()

    def _write_loop(self) -> None:
        while True:
            recorder = self._queue.get()
            try:
                if recorder is None:
                    return
                self._write(recorder)
            finally:
                self._queue.task_done()

    def _write(self, recorder: TraceRecorder) -> None:
        started = time.perf_counter()
        try:
            data = build_step_stats(recorder, self.model)
            name = _file_name(self._sink.display)
            where = self._sink.write(name, data)
        except Exception as exc:  # noqa: BLE001 - counted and logged, never raised
            self.stats["write_errors"] += 1
            self.stats["last_error"] = f"{type(exc).__name__}: {exc}"
            log.warning("%s: writing the timeline of step %d to %s failed: %s", self.model,
                        recorder.step, self._sink.display, self.stats["last_error"])
            return
        self.stats["written"] += 1
        self.stats["last_file"] = where
        self.stats["write_ms_total"] += (time.perf_counter() - started) * 1000
        log.info("%s: timeline of step %d written to %s", self.model, recorder.step, where)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued trace is written (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the writer. Later traces are dropped."""
        self._closed = True
        self.done = True
        writer = self._writer
        if writer is not None:
            self.flush(timeout)
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                return
            writer.join(timeout)

    # --- facts ------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        with self._lock:
            steps = self._step
        return {
            "timeline_path": self._sink.display,
            "start_step": self.start_step, "interval_step": self.interval_step,
            "trace_count": self.trace_count,
            "steps_counted": steps, "done": self.done,
            **self.stats,
        }


def _lane_name(lane: int | None) -> str:
    return f"lane {lane}" if lane is not None else "no lane (failed before run)"


def stage_events(recorder: TraceRecorder, model: str, engine_events: list[TraceEvent]) -> list[TraceEvent]:
    """The processor's stages as events on :data:`PROCESSOR_DEVICE`, thread = the lane.

    Adds three stages derived from the engine's events inside ``run``: ``lane_wait`` (the call
    until the engine's first op: feed conversion, session set-up, waiting for the lane's
    threads), ``engine`` (first op start to last op end) and ``return`` (last op end until the
    call returned: fetching outputs back). The engine's own ``stages`` (the tracing's own
    cost) are added as they are.
    """
    tid = recorder.lane if recorder.lane is not None else 0
    stages = list(recorder.stages)
    if recorder.engine is not None:
        stages += recorder.engine.stages
    if recorder.run_window and engine_events:
        run_start, run_end = recorder.run_window
        first = min(e.start_us for e in engine_events)
        last = max(e.start_us + e.duration_us for e in engine_events)
        if run_start <= first <= last <= run_end:
            stages += [("lane_wait", run_start, first - run_start), ("engine", first, last - first),
                       ("return", last, run_end - last)]
    stages.sort(key=lambda s: (s[1], -s[2]))
    # The op type is the stage name too: TensorFlow's own timeline tool names events by op type.
    return [TraceEvent(name=name, op=name, device=PROCESSOR_DEVICE, thread=tid,
                       start_us=start, duration_us=duration) for name, start, duration in stages]


def build_step_stats(recorder: TraceRecorder, model: str) -> bytes:
    """The timeline file: the engine's StepStats plus the :data:`PROCESSOR_DEVICE` device."""
    engine = recorder.engine or EngineTrace()
    lane_name = _lane_name(recorder.lane)
    if engine.step_stats:
        stats = step_stats.parse(engine.step_stats)  # unknown fields (memory, ...) pass through
        engine_events = list(step_stats.iter_events(stats))
        for dev in stats.dev_stats:
            threads = {n.thread_id for n in dev.node_stats}
            for tid in threads:
                if tid not in dev.thread_names:
                    named = engine.thread_names.get(tid)
                    dev.thread_names[tid] = f"{lane_name}: {named or f'thread {tid}'}"
    else:
        stats = step_stats.StepStats()
        engine_events = list(engine.events)
        names = {tid: f"{lane_name}: {engine.thread_names.get(tid) or f'thread {tid}'}"
                 for tid in {e.thread for e in engine_events}}
        stats.dev_stats.extend(step_stats.devices_from_events(engine_events, names))
    events = stage_events(recorder, model, engine_events)
    dev = stats.dev_stats.add(device=PROCESSOR_DEVICE)
    for event in events:
        label = (f"model={model}, step={recorder.step}, trace={recorder.ordinal}, "
                 f"lane={recorder.lane}" if event.name == "request" else "")
        if event.name == "request" and recorder.error:
            label += f", error={recorder.error!r}"
        dev.node_stats.append(step_stats.node_from_event(event, label))
    tid = recorder.lane if recorder.lane is not None else 0
    dev.thread_names[tid] = f"{lane_name} ({model})"
    return stats.SerializeToString()
