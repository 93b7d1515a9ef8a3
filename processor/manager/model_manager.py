"""ModelManager: owns one model's versions, keeps the right one serving, hands out handles.

Off the request path it reconciles the version the store declares (through the
:class:`~processor.store.version_watcher.VersionWatcher`) with the one loaded:

* a new full checkpoint (or another run) -> load a new SessionGroup (with the newest delta
  applied), warm up every lane, swap it in atomically; the old group is retired and freed once
  its in-flight requests end;
* a newer delta on the same full -> read and check it, then apply it to the live group in one
  step (no reload, no second copy of the weights);
* any failure (unreadable, truncated, mismatched checkpoint; warmup error) -> the served version
  keeps serving, the error is recorded in :meth:`info`, and that version is retried with
  exponential backoff; a newer version is tried at once.

Rollback: :meth:`rollback` serves the previously served version and pins it; :meth:`pin` serves
the parameters at a given full or delta step (or TF Serving version number); :meth:`unpin`
follows the newest again.
``restore_model_version`` in the config pins a step at start. A delta only ever applies to the
full checkpoint it follows (:mod:`processor.store.checkpoint_layout`).

Thread safety: :meth:`acquire` may be called from any number of threads; everything that loads
or swaps is serialized by an internal lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..checkpoint.delta import CheckpointError
from ..config import ModelConfig
from ..engine.session_group import SessionGroup, open_session_group
from ..features import open_feature_store
from ..errors import NotFound, ProcessorError, Unavailable, as_processor_error
from ..store.checkpoint_layout import latest_version
from ..store.model_store import ModelStore
from ..store.model_version import ModelVersion
from ..store.version_watcher import VersionWatcher
from .servable_handle import ServableHandle
from .warmup import plan_warmup, read_warmup_file, warm_up

log = logging.getLogger(__name__)

_INIT_POLL_SECONDS = 1.0
_MAX_BACKOFF_SECONDS = 300.0
_HISTORY = 16


@dataclass
class _Failure:
    attempts: int
    retry_at: float
    error: str


def needs_full_load(served: ModelVersion, target: ModelVersion) -> bool:
    """True unless ``target`` is ``served`` plus newer deltas on the same full checkpoint (for
    chained deltas: the links served must be the start of the target's chain)."""
    if (served.full_prefix != target.full_prefix or served.full_step != target.full_step
            or target.delta_step < served.delta_step):
        return True
    return len(target.delta_chain) > 1 and target.delta_chain[:len(served.delta_chain)] != served.delta_chain


class ModelManager:
    """See the module doc."""

    def __init__(self, name: str, config: ModelConfig, store: ModelStore | None = None) -> None:
        self.name = name
        self.config = config
        self.store = store or ModelStore.for_config(config)
        self._current: ServableHandle | None = None
        self._lock = threading.RLock()
        self._pinned: ModelVersion | None = None
        self._pinned_step: int | None = config.restore_model_version
        # Why a version is pinned, for model info; None while following the newest.
        self._pin_reason: str | None = ("config restore_model_version"
                                        if config.restore_model_version is not None else None)
        self._history: list[ModelVersion] = []
        self._failures: dict[ModelVersion, _Failure] = {}
        self._warmup_file: bytes | None = None
        self._watcher: VersionWatcher | None = None
        self.state = "new"
        self.last_error: str | None = None
        self.last_warmup: dict | None = None
        self.stats = {"full_loads": 0, "delta_updates": 0, "failed_updates": 0,
                      "last_full_load_seconds": None, "last_delta_seconds": None,
                      "last_delta_hold_seconds": None}
        # Embedding tables outside TensorFlow (feature_store_type / ev_storage_type); None: in TF.
        self.features = open_feature_store(config, name)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Load the first version, then watch for new ones; raise if none can be served.

        Waits up to ``init_timeout_minutes`` (-1: forever) for a version to appear and for a
        remote feature store that was unreachable at construction to answer.
        """
        if self.config.warmup_file_name:
            self._warmup_file = read_warmup_file(self.config.warmup_file_name)
        timeout = self.config.init_timeout_minutes
        deadline = None if timeout < 0 else time.monotonic() + timeout * 60
        while True:
            try:
                check_store = getattr(self.features, "check_up", None)
                if check_store is not None:  # a remote store down: fail (or wait) before loading
                    check_store()
                version = self.discover()
                break
            except Unavailable as exc:
                self._note_error(exc)
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                log.info("%s: %s; waiting for a version", self.name, exc)
                time.sleep(_INIT_POLL_SECONDS)
        self.load(version)
        watched = self.config.checkpoint_dir or version.is_version_dir  # TF Serving's base dir too
        if watched and self.config.file_system_poll_wait_seconds > 0:
            self._watcher = VersionWatcher(self.name, self.discover, self.reconcile,
                                           self.config.file_system_poll_wait_seconds)
            self._watcher.start()

    def discover(self) -> ModelVersion:
        """The version that should be served now (the pinned one, if any)."""
        if self._pinned is not None:
            return self._pinned
        return latest_version(self.store, self.config.savedmodel_dir, self.config.checkpoint_dir,
                              pin_step=self._pinned_step, delta_mode=self.config.delta_mode)

    def reconcile(self, target: ModelVersion) -> None:
        """Make ``target`` the served version (full load or delta); keep serving on failure."""
        with self._lock:
            served = self.served_version()
            stale = self._pinned is not None and target != self._pinned  # discovered before a pin
            if served == target or stale or self.state == "closed":
                return
            failure = self._failures.get(target)
            if failure is not None and time.monotonic() < failure.retry_at:
                return
            try:
                if served is None or needs_full_load(served, target):
                    self._load_locked(target)
                else:
                    self._apply_delta_locked(target)
            except ProcessorError as err:
                self._record_failure(target, err)

    def load(self, version: ModelVersion) -> None:
        """Load ``version`` into a new group and swap it in; raise (and keep serving) on failure."""
        with self._lock:
            try:
                self._load_locked(version)
            except ProcessorError as err:
                self._record_failure(version, err)
                raise

    def _load_locked(self, version: ModelVersion) -> None:
        if self._current is None:
            self.state = "loading"
        started = time.monotonic()
        local = self.store.materialize(version)
        try:
            group = open_session_group(self.config, local, features=self.features)
        except Exception as exc:
            raise as_processor_error(exc) from None
        group.version = version  # loaded from the local copy; serves (and reports) the store's version
        try:
            for delta in self._read_deltas(group.backend, local, None):  # every link checked first
                group.backend.stage_delta(delta)
                group.apply_delta(delta, version)
            if self._current is None:
                self.state = "warming"
            self.last_warmup = warm_up(group, plan_warmup(group.signature, local.savedmodel_dir,
                                                          self._warmup_file), config=self.config)
        except Exception as exc:
            group.close()
            err = as_processor_error(exc)
            raise type(err)(f"version {version.label} rejected: {err.message}", err.code) from None
        old, self._current = self._current, ServableHandle(group)
        if old is not None:
            old.retire()
        self._served(version, "full_loads", "last_full_load_seconds", time.monotonic() - started)

    def _apply_delta_locked(self, version: ModelVersion) -> None:
        started = time.monotonic()
        handle = self._current
        local = self.store.materialize(version)
        deltas = self._read_deltas(handle.group.backend, local, handle.group.version)  # all checked first
        hold = 0.0
        for delta in deltas:
            handle.group.backend.stage_delta(delta)  # rows a shared store holds: written before the gate
            hold += handle.group.apply_delta(delta, version)
        self.stats["last_delta_hold_seconds"] = round(hold, 6)
        self._served(version, "delta_updates", "last_delta_seconds", time.monotonic() - started)
        log.info("%s: applied delta %s (%d rows, %d dense tensors)", self.name, version.label,
                 sum(d.changed_rows for d in deltas), sum(len(d.dense) for d in deltas))

    def _read_deltas(self, backend, local: ModelVersion, served: ModelVersion | None) -> list:
        """The deltas that bring ``served`` (None: the bare full) to ``local``, read and checked,
        in order; CheckpointError if one was computed against another step than the one it
        follows here (a link of a chain missing, or a delta written after another full)."""
        chained = self.config.delta_mode == "chain"
        if not chained:  # the newest delta alone, computed against the full
            links, previous = local.delta_chain[-1:], local.full_step
        elif served is None or not served.delta_chain:
            links, previous = local.delta_chain, local.full_step
        else:  # the links after the ones served
            links, previous = local.delta_chain[len(served.delta_chain):], served.delta_step
        deltas = []
        for step, prefix in links:
            delta = backend.read_delta(prefix, step)
            if delta.parent_step is not None and delta.parent_step != previous:
                raise CheckpointError(f"delta {step} was computed against step {delta.parent_step} but follows "
                                      f"step {previous} here (a missing link, or a delta of another full)")
            deltas.append(delta)
            if chained:
                previous = step
        return deltas

    def _served(self, version: ModelVersion, counter: str, timing: str, seconds: float) -> None:
        self.stats[counter] += 1
        self.stats[timing] = round(seconds, 4)
        self._failures.pop(version, None)
        self._history = [v for v in self._history if v != version][-(_HISTORY - 1):] + [version]
        self.state = "ready"
        self.last_error = None
        log.info("%s: serving version %s (%.3f s)", self.name, version.label, seconds)

    def _record_failure(self, version: ModelVersion, err: ProcessorError) -> None:
        previous = self._failures.get(version)
        attempts = previous.attempts + 1 if previous else 1
        interval = max(self.config.file_system_poll_wait_seconds, 1.0)
        backoff = min(interval * 2 ** (attempts - 1), _MAX_BACKOFF_SECONDS)
        self._failures[version] = _Failure(attempts, time.monotonic() + backoff, err.message)
        self.stats["failed_updates"] += 1
        self._note_error(err)
        log.warning("%s: version %s failed (attempt %d, retry in %.0f s): %s", self.name,
                    version.label, attempts, backoff, err.message)

    def _note_error(self, err: ProcessorError) -> None:
        self.last_error = err.message
        if self._current is None:
            self.state = "failed"

    # --- rollback and pinning ---------------------------------------------------------------

    def rollback(self) -> ModelVersion:
        """Serve the previously served version and pin it; NotFound if there is none."""
        with self._lock:
            if len(self._history) < 2:
                raise NotFound(f"model {self.name!r} has no previous version to roll back to")
            target = self._history[-2]
            self.load(target)
            self._pinned, self._pin_reason = target, "rollback"
            return target

    def pin(self, step: int) -> ModelVersion:
        """Serve the parameters at ``step`` until :meth:`unpin`: a full step is exactly that full,
        a delta step the full it follows plus that delta. NotFound (listing the steps there are)
        for a step that exists nowhere."""
        with self._lock:
            version = latest_version(self.store, self.config.savedmodel_dir, self.config.checkpoint_dir,
                                     pin_step=step, delta_mode=self.config.delta_mode)
            if version != self.served_version():
                self.load(version)
            self._pinned, self._pin_reason = version, f"pin({step})"
            return version

    def unpin(self) -> ModelVersion:
        """Follow the newest version again; returns it once it serves."""
        with self._lock:
            self._pinned = None
            self._pinned_step = None
            self._pin_reason = None
            target = self.discover()
            if target != self.served_version():
                self.load(target)
            return target

    def close(self) -> None:
        """Stop watching and serving; the group is freed once in-flight requests end."""
        if self._watcher is not None:
            self._watcher.stop(timeout=5)
        with self._lock:
            old, self._current = self._current, None
            self.state = "closed"
        if old is not None:
            old.retire()
        if self.features is not None:
            self.features.close()

    # --- request path -----------------------------------------------------------------------

    def acquire_handle(self) -> ServableHandle:
        """The serving version's handle, referenced: the caller must ``release()`` it.

        The request path's plain form of :meth:`acquire`. Raises Unavailable when no version is
        ready.
        """
        while True:
            handle = self._current
            if handle is None:
                raise Unavailable(self._not_ready_message())
            if handle.acquire():
                return handle  # else it was retired between the read and the acquire: read again

    @contextlib.contextmanager
    def acquire(self) -> Iterator[SessionGroup]:
        """Yield the serving group, referenced for the duration of the block.

        Raises Unavailable when no version is ready.
        """
        handle = self.acquire_handle()
        try:
            yield handle.group
        finally:
            handle.release()

    def _not_ready_message(self) -> str:
        reason = f": {self.last_error}" if self.last_error else ""
        return f"model {self.name!r} has no version ready ({self.state}){reason}"

    @property
    def ready(self) -> bool:
        return self._current is not None

    # --- facts ------------------------------------------------------------------------------

    def served_version(self) -> ModelVersion | None:
        handle = self._current
        return handle.group.version if handle else None

    def info(self) -> dict[str, Any]:
        handle = self._current
        out: dict[str, Any] = {
            "name": self.name, "state": self.state, "last_error": self.last_error,
            "pinned": self._pinned.label if self._pinned else self._pinned_step,
            "history": [v.label for v in self._history],
            "failed_versions": [{"version": v.label, "attempts": f.attempts, "error": f.error}
                                for v, f in self._failures.items()],
            "updates": dict(self.stats),
            "warmup": self.last_warmup,
            "feature_store": self.features.describe() if self.features is not None else None,
            "watcher": None if self._watcher is None else {
                "interval_seconds": self._watcher.interval, "polls": self._watcher.polls,
                "errors": self._watcher.errors, "last_poll": self._watcher.last_poll},
        }
        if handle is not None:
            group = handle.group
            v = group.version
            out.update({
                "version": {"label": v.label, "full_step": v.full_step, "delta_step": v.delta_step,
                            "deltas_applied": [step for step, _ in v.delta_chain],
                            "mode": "following" if self._pin_reason is None else "pinned",
                            "why": self._pin_reason or ("newest version directory" if v.is_version_dir
                                                        else "newest full checkpoint and its newest delta"),
                            "savedmodel_dir": self.store.url(v.savedmodel_dir),
                            "full_checkpoint": self.store.url(v.full_prefix),
                            "delta_checkpoint": self.store.url(v.delta_prefix),
                            "run_dir": self.store.url(v.run_dir)},
                "signature": group.signature.describe(),
                "session_group": group.describe(),
            })
        return out
