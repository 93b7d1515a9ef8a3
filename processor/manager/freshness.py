"""Freshness: how old the parameters each served version answers with are (issue 45).

For every served version the manager records, when it starts serving and at each delta applied
to it, the **served step** (its newest delta's step, else its full's: a TF Serving version
directory's number) and when that step's checkpoint was **written**: the timestamp our writer
records in each checkpoint (:data:`~processor.checkpoint.delta.WRITTEN_AT_TENSOR`, the trainer's
clock), else the modification time of the checkpoint's ``.index`` (of a version directory's
``variables/variables.index``, ``saved_model.pb`` or ``.onnx`` model) as the model store reports
it. The **data age** is now minus that time: it drops as deltas land and grows while none does,
so an alert on it finds a trainer (or a publication pipeline) that stopped.

Each delta applied in place also adds its **publication-to-serving** time (now minus its written
time, so the writing of the delta, the poll interval, the read and the apply) to a histogram.
Deltas applied while a version loads are not counted: a restart would count the age of
whatever delta it starts from.

Both clocks are wall clocks (``time.time()``): a trainer clock ahead of the server's gives ages
that are too small (clamped at 0). Thread-safe.
"""

from __future__ import annotations

import bisect
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..checkpoint.delta import WRITTEN_AT_TENSOR
from ..store.model_store import ModelStore
from ..store.model_version import ModelVersion

# Upper bounds (seconds) of the publication-to-serving buckets; +Inf is implied.
PUBLISH_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class Written:
    """The served step of a version and when its checkpoint was written (seconds since the
    epoch), and where that time comes from: ``"writer"`` (the checkpoint's own) or ``"mtime"``."""

    step: int
    at: float
    source: str


def served_step(version: ModelVersion) -> int:
    """The step whose parameters ``version`` serves: its newest delta's, else its full's (0 for
    a SavedModel's own variables)."""
    return version.delta_step if version.delta_step >= 0 else version.number


def checkpoint_stamp(prefix: str) -> float | None:
    """The writer's :data:`WRITTEN_AT_TENSOR` in the (local) checkpoint ``prefix``, or None when it
    has none (another writer) or cannot be read here."""
    try:
        from tensorflow.python.training import py_checkpoint_reader

        reader = py_checkpoint_reader.NewCheckpointReader(prefix)
        return float(reader.get_tensor(WRITTEN_AT_TENSOR)) if reader.has_tensor(WRITTEN_AT_TENSOR) else None
    except Exception:  # noqa: BLE001 - no TensorFlow here, or an unreadable file: the mtime serves instead
        return None


def written_of(store: ModelStore, version: ModelVersion, local: ModelVersion, stamp: float | None = None) -> Written:
    """When ``version``'s served step was written: ``stamp`` (a delta read has it), else the
    stamp in its newest checkpoint (``local``: the same version's local copy), else that
    checkpoint's modification time in ``store`` (0 when nothing can be asked)."""
    step = served_step(version)
    newest, newest_local = ((version.delta_prefix, local.delta_prefix) if version.delta_step >= 0
                            else (version.full_prefix, local.full_prefix))
    if stamp is None and newest_local:
        stamp = checkpoint_stamp(newest_local)
    if stamp is not None:
        return Written(step, stamp, "writer")
    candidates = [newest + ".index"] if newest else [
        posixpath.join(version.savedmodel_dir, "variables", "variables.index"),
        posixpath.join(version.savedmodel_dir, "saved_model.pb"),
        posixpath.join(version.savedmodel_dir, "saved_model.pbtxt"),
        *(posixpath.join(version.savedmodel_dir, f) for f in _onnx_files(store, version.savedmodel_dir))]
    for path in candidates:
        try:
            return Written(step, store.mtime(path), "mtime")
        except (OSError, ValueError):
            continue
    return Written(step, 0.0, "mtime")


def _onnx_files(store: ModelStore, directory: str) -> list[str]:
    return [f for f in store.list_files(directory) if f.endswith(".onnx")] if directory else []


class Freshness:
    """One model's freshness (see the module doc): per served version number its
    :class:`Written`, and the publication-to-serving histogram of its in-place deltas."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[int, Written] = {}
        self._buckets = [0] * (len(PUBLISH_BUCKETS) + 1)
        self._sum = 0.0
        self._count = 0
        self._last: float | None = None

    def served(self, number: int, written: Written, delta: bool = False) -> None:
        """Version ``number`` now serves ``written``; ``delta``: a delta applied in place (its
        publication-to-serving time is counted)."""
        now = time.time()
        with self._lock:
            self._written[number] = written
            if delta and written.at > 0:
                seconds = max(0.0, now - written.at)
                self._buckets[bisect.bisect_left(PUBLISH_BUCKETS, seconds)] += 1
                self._sum += seconds
                self._count += 1
                self._last = seconds

    def describe(self, numbers: list[int]) -> dict[str, Any]:
        """For the versions ``numbers`` (those served now; others are forgotten): each one's
        served step, when it was written (and from what), its data age in seconds; and the
        publication-to-serving histogram (cumulative ``buckets`` [(le, count)], ``sum``,
        ``count``, ``last``)."""
        now = time.time()
        with self._lock:
            self._written = {n: w for n, w in self._written.items() if n in numbers}
            written = dict(self._written)
            running, buckets = 0, []
            for bound, n in zip((*PUBLISH_BUCKETS, "+Inf"), self._buckets):
                running += n
                buckets.append((bound, running))
            histogram = {"buckets": buckets, "sum": self._sum, "count": self._count, "last": self._last}
        versions = [{"version": n, "served_step": w.step, "written_at": w.at, "written_at_source": w.source,
                     "data_age_seconds": max(0.0, now - w.at) if w.at > 0 else None}
                    for n, w in sorted(written.items())]
        return {"versions": versions, "delta_publish_to_serve_seconds": histogram}
