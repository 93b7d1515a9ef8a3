"""Timeline tracing: sample requests by the ``timeline_*`` keys, write TensorFlow StepStats files.

* :class:`Tracer` decides which requests are traced and writes ``timeline-<k>`` files;
* :class:`TraceEvent` / :class:`EngineTrace` are what a backend's ``run_traced`` reports;
* :mod:`.step_stats` is the file format (TensorFlow's ``StepStats``, readable without TF);
* ``tools/timeline/gen_timeline.py`` turns a file into Chrome trace JSON and an op summary.
"""

from .events import EngineTrace, TraceEvent
from .tracer import PROCESSOR_DEVICE, Tracer, TraceRecorder

__all__ = ["EngineTrace", "PROCESSOR_DEVICE", "TraceEvent", "TraceRecorder", "Tracer"]
