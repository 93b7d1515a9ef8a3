"""Traced runs of the ONNX Runtime backend: a request on profiling sessions of its own.

ORT profiles whole sessions and ``end_profiling()`` stops a session's profiler for good, so a
traced call gets a fresh profiling session of its own, built like the lane's serving session
(same providers, thread settings, shared initializers: no weight copy); a split graph gets one
per part, and its trace holds both parts' ops.
It runs the request twice, a warm-up and the profiled run, so the trace shows a warm run like
the serving sessions' (first-run allocations left out). The profile file (in a private temporary
directory) is read into events (:mod:`.profile`) and deleted. The tracing's own cost shows
as two stages of the request: ``trace_setup`` (session creation and warm-up; a few ms for the
demo model) and ``trace_collect`` (ending the profile, reading it, closing the session).

Thread-safe: a backend's traced calls take turns; :meth:`TracedRuns.close` once the backend
closes.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np

from ...tracing.events import EngineTrace
from .. import device_plan, pinning
from . import placement, profile
from .ort_env import ort as _ort
from .ort_errors import engine_error as _engine_error

log = logging.getLogger(__name__)


class TracedRuns:
    """One backend's traced runs (see the module doc); sessions are built by the backend's own
    rules (``_session_options``, ``_session_run``, its parameter sets)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._directory: str | None = None  # the profile files', made on first use

    def run(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]):
        """The backend's ``run`` on fresh profiling sessions: (outputs, EngineTrace of per-op
        events). NotImplementedError when no profiling session can be opened; the run's own
        errors are ``run``'s."""
        backend = self._backend
        names = [backend._output_names[a] for a in fetches]
        ort_feeds = backend._feeds(feeds)
        index = backend._plan.lanes[lane].session
        parts, cpus = backend._parts[index], backend._session_target(index)[1]
        with self._lock:
            setup_ns = time.time_ns()
            sessions = [self._open_session(lane, k, part, cpus) for k, part in enumerate(parts)]
            opened_ns = time.time_ns()
            run = backend._session_run(sessions)
            try:
                run(names, ort_feeds, None)  # warm-up: the profiled run is a warm one
                run_ns = time.time_ns()
                outputs = run(names, ort_feeds, None)
            except Exception as exc:
                raise _engine_error(exc) from exc
            finally:
                ran_ns = time.time_ns()
                records = [profile.collect(session) for session in sessions]
            starts = [session.get_profiling_start_time_ns() for session in sessions]
            del sessions, run  # their threads and buffers go now, inside trace_collect
        events = []
        try:
            for part, part_records, start_ns in zip(parts, records, starts):
                origin = profile.origin_us(part_records, start_ns if setup_ns <= start_ns <= opened_ns else None,
                                           run_ns)
                events += profile.events(part_records, origin, part.device.gpu)
            events.sort(key=lambda e: e.start_us)
        except Exception as exc:  # noqa: BLE001 - tracing never fails a request
            log.warning("ONNX Runtime profile not understood, trace without engine ops: %s: %s",
                        type(exc).__name__, exc)
            events = []
        done_ns = time.time_ns()
        stages = (("trace_setup", setup_ns / 1000.0, (run_ns - setup_ns) / 1000.0),
                  ("trace_collect", ran_ns / 1000.0, (done_ns - ran_ns) / 1000.0))
        return outputs, EngineTrace(events=events, stages=stages,
                                    thread_names=profile.thread_names(events, threading.get_native_id()))

    def _open_session(self, lane: int, k: int, part: placement.Part, cpus: tuple[int, ...] | None):
        """A new session of ``part`` (the ``k``-th of the lane's graph) like the lane's, profiling
        from now on; NotImplementedError if ORT refuses."""
        ort = _ort()
        try:
            if self._directory is None:
                self._directory = tempfile.mkdtemp(prefix="sp-ort-profile-")
            options = self._backend._session_options(cpus, part)
            options.enable_profiling = True
            # ORT names the file after the prefix and the millisecond the session opened: the
            # parts of a split graph open in the same one, so each part has its own prefix
            options.profile_file_prefix = os.path.join(self._directory, f"lane{lane}-part{k}")
            with pinning.creation_lock:  # so that a model loading meanwhile does not count its threads
                session = ort.InferenceSession(part.model_path, options, providers=device_plan.ort_providers(part.device))
            self._backend._parameters.sets[part.device.gpu].attach(session._sess)
            return session
        except Exception as exc:
            log.warning("lane %d: no ONNX Runtime profiling session, request runs untraced: %s: %s",
                        lane, type(exc).__name__, exc)
            raise NotImplementedError(f"ONNX Runtime could not open a profiling session: {exc}") from None

    def close(self) -> None:
        """Remove the profile directory."""
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
