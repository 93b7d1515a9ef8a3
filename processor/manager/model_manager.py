"""ModelManager: owns one model's servable versions and hands out handles.

Loading happens off the request path: :meth:`start` loads the first version (waiting up to
``init_timeout_minutes`` for one to appear), :meth:`load` loads another into a new SessionGroup
and swaps it in atomically; the old group is retired and freed once its in-flight requests end.
Requests call :meth:`acquire`, a context manager yielding the serving SessionGroup.

Thread safety: ``acquire`` may be called from any number of threads; ``start``/``load``/
``close`` are serialized by an internal lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..config import ModelConfig
from ..engine.session_group import SessionGroup, open_session_group
from ..errors import ProcessorError, Unavailable, as_processor_error
from ..store.checkpoint_layout import ModelVersion, latest_version
from ..store.model_store import ModelStore
from .servable_handle import ServableHandle

log = logging.getLogger(__name__)

_INIT_POLL_SECONDS = 1.0


class ModelManager:
    """See the module doc."""

    def __init__(self, name: str, config: ModelConfig, store: ModelStore | None = None) -> None:
        self.name = name
        self.config = config
        self.store = store or ModelStore.for_path(config.savedmodel_dir)
        self._current: ServableHandle | None = None
        self._lock = threading.Lock()
        self.state = "new"
        self.last_error: str | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Load the first version; raise the load's ProcessorError if none can be served.

        Waits up to ``init_timeout_minutes`` (-1: forever) for a version to appear.
        """
        timeout = self.config.init_timeout_minutes
        deadline = None if timeout < 0 else time.monotonic() + timeout * 60
        while True:
            try:
                version = self.discover()
                break
            except Unavailable as exc:
                self._fail(exc)
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                log.info("%s: %s; waiting for a version", self.name, exc)
                time.sleep(_INIT_POLL_SECONDS)
        self.load(version)

    def discover(self) -> ModelVersion:
        """The version the store says should be served now."""
        return latest_version(self.store, self.config.savedmodel_dir, self.config.checkpoint_dir,
                              pin_full_step=self.config.restore_model_version)

    def load(self, version: ModelVersion) -> None:
        """Load ``version`` into a new group and swap it in; on failure keep the served one."""
        with self._lock:
            self.state = "loading" if self._current is None else self.state
            try:
                group = open_session_group(self.config, version)
            except Exception as exc:
                err = as_processor_error(exc)
                self._fail(err)
                raise err from None
            self._swap(ServableHandle(group))
            self.state = "ready"
            self.last_error = None
            log.info("%s: serving version %s (loaded in %.2f s)", self.name, version.label,
                     group.load_seconds)

    def _swap(self, handle: ServableHandle) -> None:
        old, self._current = self._current, handle
        if old is not None:
            old.retire()

    def _fail(self, err: ProcessorError) -> None:
        self.last_error = err.message
        if self._current is None:
            self.state = "failed"

    def close(self) -> None:
        """Stop serving; the group is freed once in-flight requests end."""
        with self._lock:
            old, self._current = self._current, None
            self.state = "closed"
        if old is not None:
            old.retire()

    # --- request path -----------------------------------------------------------------------

    @contextlib.contextmanager
    def acquire(self) -> Iterator[SessionGroup]:
        """Yield the serving group, referenced for the duration of the block.

        Raises Unavailable when no version is ready.
        """
        while True:
            handle = self._current
            if handle is None:
                raise Unavailable(self._not_ready_message())
            if handle.acquire():
                break  # else it was retired between the read and the acquire: read again
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
        out: dict[str, Any] = {"name": self.name, "state": self.state, "last_error": self.last_error}
        if handle is not None:
            group = handle.group
            v = group.version
            out.update({
                "version": {"label": v.label, "full_step": v.full_step, "delta_step": v.delta_step,
                            "full_checkpoint": v.full_prefix, "run_dir": v.run_dir},
                "signature": group.signature.describe(),
                "session_group": group.describe(),
            })
        return out
