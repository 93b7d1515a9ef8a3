"""AdminJournal: the admin actions (reload, rollback, pin, unpin, routing) of one server, for every worker.

With ``workers > 1`` an admin request reaches one worker. That worker, holding the journal's
exclusive ``flock`` (one action at a time, server-wide), first applies the entries other
workers wrote since it last looked, then its own action, and appends it to the journal (a
JSON-lines file in the supervisor's run directory) only if it succeeded; a rollback to "the
previous version" is written as the version it resolved to, so every worker ends on the same
one. The other workers read new entries every :data:`POLL_SECONDS` and apply them in order; a
failure there is logged (the model keeps what it served). A worker that starts (or restarts)
applies the journal's pins, rollbacks and unpins in order before it listens, so it serves what
the others serve; reloads it skips (it has just loaded the newest version).

Thread-safe. The journal file is removed with the supervisor's run directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from processor.shared_segments import flocked

log = logging.getLogger("server")

POLL_SECONDS = 0.25


class AdminJournal:
    """See the module doc. ``runtime``: the worker's :class:`~server.runtime.ServingRuntime`."""

    def __init__(self, path: str | os.PathLike, runtime: Any) -> None:
        self.path = Path(path)
        self.runtime = runtime
        self._offset = 0  # bytes of the journal applied here
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Apply what the journal holds (reloads skipped), then follow it on a thread."""
        with self._lock, flocked(self.path, fcntl.LOCK_SH):
            self._catch_up(replay=True)
        self._thread = threading.Thread(target=self._follow, daemon=True, name="sp-admin-journal")
        self._thread.start()

    def submit(self, kind: str, name: str, version: int | None, caller: str,
               routing: dict[str, Any] | None = None) -> dict[str, Any]:
        """Apply an admin action here, then record it for the other workers (see the module doc;
        ``routing``: a routing action's changes, recorded with it)."""
        with self._lock, flocked(self.path, fcntl.LOCK_EX) as fd:
            self._catch_up()
            result = self.runtime.apply_admin(kind, name, version, caller, routing)
            if kind == "rollback" and version is None:
                served = self.runtime.model(name).served_version()
                if served is not None and served.full_step >= 0:
                    version = served.delta_step if served.delta_step >= 0 else served.full_step
            entry = {"action": kind, "model": name, "version": version, "pid": os.getpid(), "caller": caller}
            if routing is not None:
                entry["routing"] = routing
            line = json.dumps(entry) + "\n"
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, line.encode())
            self._offset = os.lseek(fd, 0, os.SEEK_CUR)
            return result

    # --- inside -------------------------------------------------------------------------------

    def _follow(self) -> None:
        while True:  # a daemon thread: it ends with the worker
            time.sleep(POLL_SECONDS)
            try:
                if self.path.stat().st_size <= self._offset:
                    continue
            except FileNotFoundError:  # the supervisor removed its run directory: it is stopping
                return
            try:
                with self._lock, flocked(self.path, fcntl.LOCK_SH):
                    self._catch_up()
            except Exception:
                log.exception("admin journal %s: cannot follow it", self.path)

    def _catch_up(self, replay: bool = False) -> None:
        """Apply the complete entries after ``_offset`` (the caller holds the locks)."""
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        for raw in data[:end].splitlines():
            entry = json.loads(raw)
            if replay and entry["action"] == "reload":
                continue
            caller = f"worker {entry['pid']} ({entry['caller']})"
            try:
                self.runtime.apply_admin(entry["action"], entry["model"], entry["version"], caller,
                                         entry.get("routing"))
            except Exception as exc:  # logged by apply_admin with the action and model
                log.warning("admin journal: %s of %s from %s failed here: %s", entry["action"],
                            entry["model"], caller, exc)
        self._offset += end
