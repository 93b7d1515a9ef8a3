"""PredictionLogger: one model's prediction logging (the ``logging_config`` key).

Request threads (through :class:`~processor.dataplane.DataPlane`): :meth:`begin` draws one
random number against ``sampling_rate`` and, for a sampled call, returns a
:class:`~.record.Pending` that the DataPlane fills in as the call goes; :meth:`submit` appends
it to a bounded queue and returns (a full queue drops the record and counts it; nothing blocks,
nothing raises). An unsampled call costs the draw.

The writer thread (one per model) drains the queue every few tens of milliseconds: encodes
each record (:mod:`.formats`: wire calls transcoded, others decoded first), appends it to the
current file (:class:`~.files.LogFiles`: rotation by size and age) and uploads closed files
when ``path`` is a URL (:class:`~.files.Uploader`). A record that fails to decode or encode, and
a write or upload that fails (disk full, bucket unreachable), is counted and reported in
:meth:`describe` (model info, metrics); serving is never affected. :meth:`flush` closes the
current file after writing what is queued; :meth:`close` (model close, SIGTERM drain) does the
same and stops the thread.

Thread-safe: :meth:`begin`, :meth:`submit`, :meth:`describe` and :meth:`flush` from any thread.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import random
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ProcessorError
from ..redaction import redact_url
from ..request import PredictCall, PredictResult, request_id_var
from .files import LogFiles, Uploader
from .formats import FORMATS
from .record import Pending
from .settings import LoggingConfig

if TYPE_CHECKING:
    from ..config import ModelConfig

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05  # how often the writer looks at the queue (request threads never signal it)
_LOG_EVERY = 10.0  # seconds between two warnings about failing writes


class PredictionLogger:
    """See the module doc. ``files`` and ``uploader`` are built by :meth:`from_config`."""

    def __init__(self, model: str, settings: LoggingConfig, files: LogFiles,
                 uploader: Uploader | None = None) -> None:
        self.model = model
        self.settings = settings
        self._rate = settings.sampling_rate
        self._encode = FORMATS[settings.format]
        self._files = files
        self._uploader = uploader
        if uploader is not None:
            files.on_closed = uploader.pending.append  # uploaded by the writer after each step
        self._queue: collections.deque[Pending] = collections.deque()
        self._limit = settings.queue_size
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_asked = 0
        self._close_asked = 0  # the last flush that also closes the current file
        self._flush_done = 0
        self._closing = False
        self.stats: dict[str, Any] = {"written": 0, "dropped_queue_full": 0, "dropped_closed": 0,
                                      "failed": 0, "write_errors": 0, "upload_errors": 0,
                                      "last_error": None}
        self._last_warning = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"sp-predlog-{model}")
        self._thread.start()

    @classmethod
    def from_config(cls, model: str, config: ModelConfig) -> PredictionLogger | None:
        """The logger ``logging_config`` asks for, or None when it is absent. Raises ConfigError
        naming ``logging_config.path`` (or ``staging_dir``) when it cannot be written."""
        settings = config.logging_config
        if settings is None:
            return None
        uploader = _uploader(settings, config) if settings.remote else None
        if settings.remote:
            # one per model and URL, not per process: a restart recovers what a crash left
            url_digest = hashlib.sha256(settings.path.encode()).hexdigest()[:12]
            directory = settings.staging_dir or os.path.join(
                tempfile.gettempdir(), "sp-prediction-log", f"{_safe_prefix(model)}-{url_digest}")
            key = "staging_dir"
        else:
            directory = settings.path.removeprefix("file://")
            key = "path"
        files = LogFiles(directory, settings.filename_prefix or _safe_prefix(model), settings.extension,
                         settings.max_file_bytes, settings.max_file_age_seconds)
        try:
            files.check()
        except OSError as exc:
            raise ConfigError(f"logging_config.{key}: cannot write log files to {directory!r}: "
                              f"{exc.strerror or exc}") from None
        return cls(model, settings, files, uploader)

    # --- request threads --------------------------------------------------------------------

    def begin(self, call) -> Pending | None:
        """A Pending record for ``call`` (a PredictCall) if it is sampled, else None."""
        rate = self._rate
        if rate < 1.0 and random.random() >= rate:
            return None
        return Pending(call.model, time.time_ns(), request_id_var.get(), call.inputs, call.output_filter)

    def submit(self, pending: Pending) -> None:
        """Queue a finished record for the writer; a full queue (or a closed logger) drops it
        and counts it. Never blocks, never raises."""
        if len(self._queue) < self._limit and not self._closing:
            self._queue.append(pending)
            return
        with self._lock:
            self.stats["dropped_closed" if self._closing else "dropped_queue_full"] += 1

    def log_answered(self, name: str, data, group, result) -> None:
        """Log one request answered on a merged path (``DataPlane.predict_many``), if sampled:
        its wire ``data``, the ``group`` that served it, and its response bytes or its
        ProcessorError ``result``. Never blocks, never raises."""
        pending = self.begin(PredictCall(name, data))
        if pending is None:
            return
        pending.group = group
        if isinstance(result, ProcessorError):
            pending.error = result
        else:
            pending.result = PredictResult(result, group.version, group.signature)
        self.submit(pending)

    # --- reporting, flush, close ------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Settings and counters, for model info and metrics."""
        s = self.settings
        with self._lock:
            stats = dict(self.stats)
        stats.update(
            format=s.format, path=redact_url(s.path), sampling_rate=s.sampling_rate,
            max_file_bytes=s.max_file_bytes, max_file_age_seconds=s.max_file_age_seconds,
            queue_size=s.queue_size, queued=len(self._queue), directory=self._files.directory,
            current_file=self._files.current, files_closed=self._files.files_closed,
            files_recovered=self._files.files_recovered,
            bytes_written=self._files.bytes_written)
        if self._uploader is not None:
            stats.update(files_uploaded=self._uploader.uploaded, uploads_pending=len(self._uploader.pending))
        return stats

    def flush(self, timeout: float = 30.0, close_file: bool = True) -> bool:
        """Write every record queued now and (``close_file``) close the current file, uploading
        it when ``path`` is a URL; False if that did not happen within ``timeout`` seconds."""
        with self._flushed:
            self._flush_asked += 1
            wanted = self._flush_asked
            if close_file:
                self._close_asked = wanted
            self._wake.set()
            return self._flushed.wait_for(
                lambda: self._flush_done >= wanted or not self._thread.is_alive(), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new records, write the queued ones, close the file, stop the writer."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("model %s: prediction log writer still busy after %s s", self.model, timeout)

    # --- writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        self._sink(self._files.recover)  # what a process that died left unpublished
        while True:
            closing = self._closing
            flush, close = self._flush_asked, self._close_asked
            self._write_queued()
            due = self._files.due_in(time.monotonic())
            if closing or close > self._flush_done or (due is not None and due <= 0):
                self._sink(self._files.rotate)
            if self._uploader is not None and self._uploader.pending:
                self._sink(self._uploader.upload, "upload_errors")
            if flush > self._flush_done:
                with self._flushed:
                    self._flush_done = flush
                    self._flushed.notify_all()
            if closing:
                with self._flushed:
                    self._flushed.notify_all()
                return
            wait = POLL_SECONDS if due is None else min(POLL_SECONDS, max(due, 0.001))
            self._wake.wait(wait)
            self._wake.clear()

    def _write_queued(self) -> None:
        queue, files, written = self._queue, self._files, 0
        while queue:
            pending = queue.popleft()
            try:
                record = self._encode(pending, self._rate)
            except Exception as exc:  # noqa: BLE001 - a record that cannot be written is counted
                self._failed(f"record of request {pending.request_id}: {type(exc).__name__}: {exc}")
                continue
            if self._sink(files.write, "write_errors", record):
                written += 1
            else:
                self._failed(None)
        if written:
            self._sink(files.flush)
            with self._lock:
                self.stats["written"] += written

    def _sink(self, action, counter: str = "write_errors", *args) -> bool:
        """Run a file or upload action; count and report its failure (never raises)."""
        try:
            action(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - a failing sink never reaches a request
            message = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.stats[counter] += 1
                self.stats["last_error"] = message
            self._warn(f"prediction log {counter.replace('_', ' ')[:-1]}: {message}")
            return False

    def _failed(self, message: str | None) -> None:
        with self._lock:
            self.stats["failed"] += 1
            if message is not None:
                self.stats["last_error"] = message
        if message is not None:
            self._warn(f"prediction log record not written: {message}")

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _LOG_EVERY:
            self._last_warning = now
            log.warning("model %s: %s", self.model, message)


def _uploader(settings: LoggingConfig, config: ModelConfig) -> Uploader:
    """The upload target of a URL ``path``: through the model store's file system when the URL
    has its scheme (its credentials and endpoint apply), else fsspec's for the URL."""
    import fsspec

    from ..store.model_store import ModelStore

    url = settings.path
    shown = redact_url(url)
    try:
        store = ModelStore.for_config(config)
        if store.scheme and url.startswith(f"{store.scheme}://"):
            fs, root = store.fs, store.strip(url)
        else:
            fs, root = fsspec.core.url_to_fs(url)
        uploader = Uploader(fs, root, shown)
        uploader.check()
    except ConfigError:
        raise
    except Exception as exc:  # ImportError (no such file system), OSError, store-specific errors
        raise ConfigError(f"logging_config.path: cannot write log files to {shown!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    return uploader


def _safe_prefix(model: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in model)[:64] or "model"
