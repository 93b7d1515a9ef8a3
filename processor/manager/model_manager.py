"""ModelManager: owns one model's versions, keeps the right ones serving, hands out handles.

Several versions may serve side by side (``model_version_policy``,
:mod:`processor.store.version_policy`): each is a SessionGroup of its own behind its own
:class:`ServableHandle`, keyed by its TF Serving number; the newest is the default, which a call
naming no version gets. Off the request path it reconciles the versions the store declares
(through the :class:`~processor.store.version_watcher.VersionWatcher`) with those loaded, for
each number:

* a new full checkpoint (or another run) -> load a new SessionGroup (with the newest delta
  applied), warm up every lane, swap it in atomically; the old group is retired and freed once
  its in-flight requests end;
* a newer delta on the same full -> read and check it, then apply it to the live group in one
  step (no reload, no second copy of the weights);
* any failure (unreadable, truncated, mismatched checkpoint; warmup error) -> the served version
  keeps serving, the error is recorded in :meth:`info`, and that version is retried with
  exponential backoff; a newer version is tried at once;
* deltas apply to the newest version only: an older one serves the step it was loaded at;
* a version leaving the policy is retired once every version the policy names serves (so a
  failed newer version never leaves fewer serving than before), and freed when its last
  in-flight request ends.

The parts, each in its own module: what to do with a version the store names is the pure
:func:`~processor.manager.policy.next_action`; the steps of a load or a delta (materialize,
open, apply deltas, warm up, close on failure) are the
:class:`~processor.manager.loader.VersionLoader`'s; the model's state moves through
:func:`~processor.manager.model_state.transition`, which refuses a move its table does not
allow. The manager holds the served handle, the pin, the history and the failures, and swaps.
The loader and the clock (``monotonic()``, ``sleep()``; the ``time`` module by default) may be
injected: tests run the manager over fakes.

Rollback: :meth:`rollback` serves the previously served version and pins it; :meth:`pin` serves
the parameters at a given full or delta step (or TF Serving version number); :meth:`unpin`
follows the newest again. A pin serves that one version alone, whatever the policy.
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..config import ModelConfig
from ..engine.session_group import SessionGroup
from ..features import FeatureStore, open_feature_store
from ..errors import NotFound, ProcessorError, Unavailable
from ..request import not_served
from ..store.checkpoint_layout import served_versions
from ..store.model_store import ModelStore
from ..store.model_version import ModelVersion
from ..store.version_watcher import VersionWatcher
from .. import load_priority, memory
from .freshness import Freshness
from .loader import VersionLoader
from ..memory_budget import MemoryBudget, default_budget
from .policy import Action, Failure, Retries, next_action, record_failure
from .servable_handle import ServableHandle
from .model_state import ModelState, transition
from .warmup import read_warmup_file

log = logging.getLogger(__name__)

_INIT_POLL_SECONDS = 1.0
_HISTORY = 16


class ModelManager:
    """See the module doc."""

    def __init__(self, name: str, config: ModelConfig, store: ModelStore | None = None,
                 loader: VersionLoader | None = None, clock: Any = time, batching=None,
                 budget: MemoryBudget | None = None) -> None:
        memory.pin_malloc_thresholds()  # before any load: see there
        self.name = name
        self.config = config
        self.store = store or ModelStore.for_config(config)
        self._clock = clock
        self._current: ServableHandle | None = None  # the default: the newest served version
        self._handles: dict[int, ServableHandle] = {}  # every served version, by TF Serving number
        self._lock = threading.RLock()
        self._pinned: ModelVersion | None = None
        self._pinned_step: int | None = config.restore_model_version
        # Why a version is pinned, for model info; None while following the newest.
        self._pin_reason: str | None = ("config restore_model_version"
                                        if config.restore_model_version is not None else None)
        self._history: list[ModelVersion] = []
        self._failures: dict[ModelVersion, Failure] = {}
        self._warmup_file: bytes | None = None
        self._watcher: VersionWatcher | None = None
        self._state = ModelState.NEW
        self.last_error: str | None = None
        self.last_warmup: dict | None = None
        self.stats = {"full_loads": 0, "delta_updates": 0, "failed_updates": 0,
                      "last_full_load_seconds": None, "last_delta_seconds": None,
                      "last_delta_hold_seconds": None}
        # Embedding tables outside TensorFlow (feature_store_type / ev_storage_type; None: in
        # TF) and the loader over them: made by start(), where a remote store is first probed.
        self.features: FeatureStore | None = None
        self.loader: VersionLoader | None = loader
        self._batching = batching  # the model's ModelBatching, for each group's native queue
        self._budget = budget if budget is not None else default_budget()  # the fit check before loads
        self._on_default: list[Callable[[SessionGroup | None], None]] = []  # follow_default's
        self.freshness = Freshness()  # how old each served version's parameters are (freshness.py)

    @property
    def state(self) -> ModelState:
        """The model's :class:`~processor.manager.model_state.ModelState` (a ``str``)."""
        return self._state

    def _to(self, state: ModelState) -> None:
        self._state = transition(self._state, state)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Load the first version, then watch for new ones; raise if none can be served.

        Waits up to ``init_timeout_minutes`` (-1: forever) for a version to appear and for a
        remote feature store that was unreachable at construction to answer.
        """
        if self.loader is None:
            self.features = open_feature_store(self.config, self.name)
            self.loader = VersionLoader(self.config, self.store, self.features, batching=self._batching,
                                        model=self.name)
        if self.config.warmup_file_name:
            self._warmup_file = read_warmup_file(self.config.warmup_file_name)
        timeout = self.config.init_timeout_minutes
        deadline = None if timeout < 0 else self._clock.monotonic() + timeout * 60
        while True:
            if self._state is ModelState.CLOSED:
                raise Unavailable(f"model {self.name!r} was closed before it served a version")
            try:
                check_store = getattr(self.features, "check_up", None)  # remote stores have one
                if check_store is not None:  # a remote store down: fail (or wait) before loading
                    check_store()
                versions = self.discover_all()
                break
            except Unavailable as exc:
                self._note_error(exc)
                if deadline is not None and self._clock.monotonic() >= deadline:
                    raise
                log.info("%s: %s; waiting for a version", self.name, exc)
                self._clock.sleep(_INIT_POLL_SECONDS)
        self._start_versions(versions)
        watched = self.config.checkpoint_dir or versions[-1].is_version_dir  # TF Serving's base dir too
        if watched and self.config.file_system_poll_wait_seconds > 0:
            self._watcher = VersionWatcher(self.name, self.discover_all, self.reconcile,
                                           self.config.file_system_poll_wait_seconds)
            self._watcher.start()

    def discover(self) -> ModelVersion:
        """The newest version that should be served now (the pinned one, if any)."""
        return self.discover_all()[-1]

    def discover_all(self) -> list[ModelVersion]:
        """Every version that should be served now, ascending by number: the pinned one alone,
        else those the ``model_version_policy`` selects."""
        if self._pinned is not None:
            return [self._pinned]
        return served_versions(self.store, self.config.savedmodel_dir, self.config.checkpoint_dir,
                               self.config.model_version_policy, pin_step=self._pinned_step,
                               delta_mode=self.config.delta_mode)

    def _start_versions(self, versions: list[ModelVersion]) -> None:
        """The first loads, newest first (it is the default); raise when none serves. With
        ``max_num_load_retries`` (TF Serving's) a failed first load is tried again, that many
        times, before the next one."""
        errors: list[ProcessorError] = []
        for version in reversed(versions):
            while True:
                try:
                    self.load(version)
                    break
                except ProcessorError as err:
                    if not self._wait_for_retry(version):
                        errors.append(err)
                        break
        if not self._handles:
            raise errors[0]

    def _retries(self) -> Retries:
        micros = self.config.load_retry_interval_micros
        return Retries(self.config.max_num_load_retries, None if micros is None else micros / 1e6)

    def _wait_for_retry(self, version: ModelVersion) -> bool:
        """Whether a first load of ``version`` that failed is tried again (after waiting for its
        retry): only under TF Serving's ``max_num_load_retries``, until given up."""
        failure = self._failures.get(version)
        if self.config.max_num_load_retries is None or failure is None or failure.given_up:
            return False
        self._clock.sleep(max(0.0, failure.retry_at - self._clock.monotonic()))
        return self._state is not ModelState.CLOSED

    def reconcile(self, targets: ModelVersion | Sequence[ModelVersion]) -> None:
        """Make ``targets`` (one version or the policy's list) the served versions (full loads,
        or deltas on the newest); keep serving on failure; retire versions no longer named once
        every named one serves."""
        if isinstance(targets, ModelVersion):
            targets = [targets]
        with self._lock:
            if self._state is ModelState.CLOSED:
                return
            numbers = [t.number for t in targets]
            newest = max(numbers)
            for target, number in sorted(zip(targets, numbers), key=lambda tn: -tn[1]):
                handle = self._handles.get(number)
                if handle is not None and number != newest:
                    continue  # an older version serves the step it was loaded at
                served = handle.group.version if handle is not None else None
                action = next_action(served, target, self._failures, self._pinned, self._clock.monotonic())
                try:
                    if action is Action.LOAD_FULL:
                        self._load_locked(target, pinned=self._pinned is not None)
                    elif action is Action.APPLY_DELTA:
                        self._apply_delta_locked(handle.group, target)
                except ProcessorError as err:
                    self._record_failure(target, err)
            if all(n in self._handles for n in numbers):
                self._retire_except(set(numbers))

    def load(self, version: ModelVersion, pinned: bool = False) -> None:
        """Load ``version`` into a new group and swap it in for its number (another number keeps
        serving); raise (and keep serving) on failure. ``pinned``: it is loaded to be pinned (see
        :meth:`VersionLoader.load`), and serves alone once it serves."""
        with self._lock:
            if self._state is ModelState.CLOSED:
                raise Unavailable(f"model {self.name!r} is closed")
            try:
                self._load_locked(version, pinned)
            except ProcessorError as err:
                self._record_failure(version, err)
                raise
            if pinned:
                self._retire_except({version.number})

    def reload(self) -> None:
        """Load every version the store and policy name now afresh (each swapped in for its number);
        raise the first failure (the versions serving keep serving)."""
        with self._lock:
            targets = self.discover_all()
            for version in reversed(targets):
                self.load(version, pinned=self._pinned is not None)
            self._retire_except({t.number for t in targets})

    def _retire_except(self, numbers: set[int]) -> None:
        """Retire every served version whose number is not in ``numbers`` (freed once drained)."""
        for number in [n for n in self._handles if n not in numbers]:
            handle = self._handles.pop(number)
            log.info("%s: version %s leaves the served set; unloaded once its requests end", self.name,
                     handle.group.version.label)
            handle.retire()
        self._set_default()

    def _set_default(self) -> None:
        self._current = self._handles[max(self._handles)] if self._handles else None
        self._tell_default()

    def follow_default(self, listener: Callable[[SessionGroup | None], None]) -> None:
        """Tell ``listener`` the default version's group (None: none serves) now and each time
        it changes, under the manager's lock: for what must follow the default without a
        request's help (the C ABI's direct path). It must be quick; its errors are logged."""
        with self._lock:
            self._on_default.append(listener)
            self._tell_default([listener])

    def _tell_default(self, listeners: list | None = None) -> None:
        group = self._current.group if self._current is not None else None
        for listener in self._on_default if listeners is None else listeners:
            try:
                listener(group)
            except Exception:  # a listener's bug must not fail a load
                log.exception("%s: a default-version listener failed", self.name)

    def _load_locked(self, version: ModelVersion, pinned: bool = False) -> None:
        if self._current is None:
            self._to(ModelState.LOADING)
        started = self._clock.monotonic()

        def warming() -> None:
            if self._current is None:
                self._to(ModelState.WARMING)

        engine = self.config.backend
        try:
            file_bytes = self.loader.file_bytes(version)
            self._budget.admit(self.name, version.label, engine, file_bytes)  # LoadRefused: it would not fit
            before = memory.process_rss_bytes()
            # below serving priority: a load never holds what requests wait for (a delta does:
            # its apply runs at serving priority)
            with load_priority.lowered(self.config.load_nice):
                loaded = self.loader.load(version, self._warmup_file, on_warming=warming, pinned=pinned)
        except Exception:
            if self._current is None:  # LOADING or WARMING: nothing serves
                self._to(ModelState.FAILED)
            raise
        self._budget.learn(engine, file_bytes, memory.process_rss_bytes() - before)
        self.last_warmup = loaded.warmup
        number = version.number
        old = self._handles.get(number)
        self._handles[number] = ServableHandle(loaded.group)
        self._set_default()
        if old is not None:
            old.retire()
        self._served(version, "full_loads", "last_full_load_seconds", self._clock.monotonic() - started, pinned)
        if loaded.written is not None:
            self.freshness.served(number, loaded.written)

    def _apply_delta_locked(self, group: SessionGroup, version: ModelVersion) -> None:
        started = self._clock.monotonic()
        applied = self.loader.apply_delta(group, version)
        self.stats["last_delta_hold_seconds"] = round(applied.hold_seconds, 6)
        self._served(version, "delta_updates", "last_delta_seconds", self._clock.monotonic() - started)
        if applied.written is not None:
            self.freshness.served(version.number, applied.written, delta=True)
        log.info("%s: applied delta %s (%d rows, %d removed, %d dense tensors)", self.name, version.label,
                 applied.rows, applied.removed, applied.dense)

    def _served(self, version: ModelVersion, counter: str, timing: str, seconds: float,
                pinned: bool = False) -> None:
        self.stats[counter] += 1
        self.stats[timing] = round(seconds, 4)
        self._failures.pop(version, None)
        if version.number >= max(self._handles, default=-1) or self._pinned is not None or pinned:
            # the versions that served as the default, for rollback (an older one of the policy's
            # versions loading beside the newest is not one)
            self._history = [v for v in self._history if v != version][-(_HISTORY - 1):] + [version]
        self._to(ModelState.READY)
        self.last_error = None
        log.info("%s: serving version %s (%.3f s)", self.name, version.label, seconds)

    def _record_failure(self, version: ModelVersion, err: ProcessorError) -> None:
        now = self._clock.monotonic()
        failure = record_failure(self._failures.get(version), err.message, now,
                                 self.config.file_system_poll_wait_seconds, self._retries())
        self._failures[version] = failure
        self.stats["failed_updates"] += 1
        self._note_error(err)
        if failure.given_up:
            log.warning("%s: version %s failed (attempt %d, max_num_load_retries reached: given up): %s",
                        self.name, version.label, failure.attempts, err.message)
            return
        log.warning("%s: version %s failed (attempt %d, retry in %.0f s): %s", self.name,
                    version.label, failure.attempts, failure.retry_at - now, err.message)

    def _note_error(self, err: ProcessorError) -> None:
        self.last_error = err.message
        if self._current is None and self._state is not ModelState.CLOSED:
            self._to(ModelState.FAILED)

    # --- rollback and pinning ---------------------------------------------------------------

    def rollback(self) -> ModelVersion:
        """Serve the previously served version and pin it; NotFound if there is none."""
        with self._lock:
            if len(self._history) < 2:
                raise NotFound(f"model {self.name!r} has no previous version to roll back to")
            target = self._history[-2]
            self.load(target, pinned=True)
            self._pinned, self._pin_reason = target, "rollback"
            return target

    def pin(self, step: int) -> ModelVersion:
        """Serve the parameters at ``step`` until :meth:`unpin`: a full step is exactly that full,
        a delta step the full it follows plus that delta. NotFound (listing the steps there are)
        for a step that exists nowhere."""
        with self._lock:
            version = served_versions(self.store, self.config.savedmodel_dir, self.config.checkpoint_dir,
                                      pin_step=step, delta_mode=self.config.delta_mode)[-1]
            self._serve_exactly([version], pinned=True)
            self._pinned, self._pin_reason = version, f"pin({step})"
            return version

    def unpin(self) -> ModelVersion:
        """Follow the newest version again; returns it once it serves."""
        with self._lock:
            self._pinned = None
            self._pinned_step = None
            self._pin_reason = None
            targets = self.discover_all()
            self._serve_exactly(targets)
            return targets[-1]

    def _serve_exactly(self, targets: list[ModelVersion], pinned: bool = False) -> None:
        """Serve ``targets`` and nothing else: each not served as it is loads (newest first; a
        failure raises, and what serves keeps serving), then the other versions retire."""
        for target in reversed(targets):
            handle = self._handles.get(target.number)
            if handle is None or handle.group.version != target:
                self.load(target, pinned)
        self._retire_except({t.number for t in targets})

    def close(self) -> None:
        """Stop watching and serving; the group is freed once in-flight requests end."""
        if self._watcher is not None:
            self._watcher.stop(timeout=5)
        with self._lock:
            old, self._current = list(self._handles.values()), None
            self._handles = {}
            self._to(ModelState.CLOSED)
            self._tell_default()
        for handle in old:
            handle.retire()
        if self.features is not None:
            self.features.close()

    # --- request path -----------------------------------------------------------------------

    def acquire_handle(self, number: int | None = None) -> ServableHandle:
        """The handle of served version ``number`` (None: the default, the newest), referenced:
        the caller must ``release()`` it.

        The request path's plain form of :meth:`acquire`. Raises Unavailable when no version is
        ready, NotFound (TF Serving's words) when ``number`` is not served.
        """
        while True:
            handle = self._current if number is None else self._handles.get(number)
            if handle is None:
                if number is not None and self._current is not None:
                    raise not_served(self.name, number, f"versions {sorted(self._handles)}")
                raise Unavailable(self._not_ready_message())
            if handle.acquire():
                return handle  # else it was retired between the read and the acquire: read again

    @contextlib.contextmanager
    def acquire(self, number: int | None = None) -> Iterator[SessionGroup]:
        """Yield served version ``number``'s group (None: the default), referenced for the
        duration of the block. Raises as :meth:`acquire_handle`."""
        handle = self.acquire_handle(number)
        try:
            yield handle.group
        finally:
            handle.release()

    def _not_ready_message(self) -> str:
        reason = f": {self.last_error}" if self.last_error else ""
        return f"model {self.name!r} has no version ready ({self._state.value}){reason}"

    @property
    def ready(self) -> bool:
        return self._current is not None

    # --- facts ------------------------------------------------------------------------------

    def served_version(self) -> ModelVersion | None:
        """The default (newest) served version; None before the first load."""
        handle = self._current
        return handle.group.version if handle else None

    def served_versions(self) -> list[ModelVersion]:
        """Every served version, ascending by number."""
        handles = dict(self._handles)
        return [handles[n].group.version for n in sorted(handles)]

    def serves(self, number: int) -> bool:
        """Whether version ``number`` is served now."""
        return number in self._handles

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes each served version holds, by part (``SessionGroup.memory``), by version number
        (as a string, JSON's key)."""
        handles = dict(self._handles)
        return {str(n): handles[n].group.memory() for n in sorted(handles)}

    def serves_several(self) -> bool:
        """Whether more than one version is served now."""
        return len(self._handles) > 1

    def default_group(self) -> SessionGroup | None:
        """The default version's group (None: none serves), read without a reference or the
        lock: a hint only, for the version may be replaced at any moment (the DataPlane's plan
        reads it when ``follow_default`` tells it of a change)."""
        handle = self._current
        return handle.group if handle is not None else None

    def freshness_info(self) -> dict[str, Any]:
        """Each served version's served step, when it was written and its data age, and the
        deltas' publication-to-serving histogram (:meth:`~.freshness.Freshness.describe`)."""
        return self.freshness.describe(sorted(self._handles))

    def info(self) -> dict[str, Any]:
        handle = self._current
        out: dict[str, Any] = {
            "name": self.name, "state": self._state.value, "last_error": self.last_error,
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
            "version_policy": self.config.model_version_policy.describe(),
            "versions": [{"version": v.number, "label": v.label, "state": "AVAILABLE",
                          "full_step": v.full_step, "delta_step": v.delta_step}
                         for v in self.served_versions()],
            "memory": self.memory(),
            "freshness": self.freshness_info(),
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
