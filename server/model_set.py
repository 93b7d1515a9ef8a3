"""The live model set: a running server takes a new deployment's models without a restart.

:meth:`ModelSet.apply` compares a new, validated :class:`~server.settings.DeploymentConfig`
with the models served and, per model name:

* **added**: composed and loaded (warm-up included) on a thread of its own beside the others,
  served once it is ready; a model that fails to load is not served, and its error reported;
* **removed**: from that moment its requests are NOT_FOUND; it drains (requests running finish on
  their version) and is closed, its versions freed as their last requests end;
* **changed** ``model_config``, ``inference_threads`` or ``max_queued_requests``: a new model is
  loaded beside the old one and swapped in when ready (the old one serves until then, and if the
  new one fails to load, on); the old one is then retired as a removed one is;
* **changed routing only** (``version_labels``, ``traffic``, ``shadow``): applied to the running
  model, nothing reloaded (a label or arm naming a version not served is reported, as at start).

Server-level keys (ports, host, workers, limits, TLS...) cannot change under a running server:
a new file that changes them is applied for its models, and those keys are reported (logged and
in the report), not half-applied. A file that does not validate is refused as a whole (logged,
reported): the running set keeps serving.

Where a new deployment comes from (:meth:`ModelSet.reload`): the file the server was started
with (our JSON, or TF Serving's text-format ``ModelServerConfig``: :func:`read_deployment`; the
``tensorflow_model_server`` entry point, :mod:`server.tfserving.cli`, gives a reader of its own that
also applies its flags), re-read when it changes (polled every ``model_config_file_poll_wait_seconds``; 0: not
polled) and on SIGHUP. With ``workers > 1`` the supervisor reads the file, and each worker the
copy the supervisor rewrites (and signals): every worker follows, and a worker restarted later
starts from the new set.

The set also remembers the models it stopped serving (:attr:`ModelSet.unserved`: removed ones,
"unloaded", and ones whose load failed, with the error), so that they can be loaded again by name
(:mod:`server.repository`, the load / unload APIs, builds its changes with :meth:`ModelSet.change`).

One apply at a time (a lock); loads run on the caller's thread (a background one: the poller,
an admin request's executor). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from processor.errors import ConfigError, as_processor_error
from processor.served_model import compose_entry

from .settings import DeploymentConfig

log = logging.getLogger("server")

# a model entry's keys whose change needs a new model (the others: routing, applied live)
_RELOADED = ("config", "inference_threads", "max_queued_requests")


def read_deployment(path: str | Path, overrides: dict[str, Any] | None = None) -> tuple[DeploymentConfig, dict]:
    """The deployment file at ``path``, validated, with ``overrides`` (the command line's
    ports, host, workers) applied; ConfigError naming the problem. The file is our JSON, or TF
    Serving's text-format ``ModelServerConfig`` (:mod:`server.tfserving.model_config`: its models, the
    server's keys at their defaults), told apart by its first character."""
    from processor.config_text import read_json_file

    from .tfserving.model_config import is_json, read_model_entries

    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        head = b"{"  # read_json_file names the problem
    if is_json(head):
        data = read_json_file(str(path), "--config")  # ConfigError: unreadable, not UTF-8, not JSON
    else:
        data = {"models": read_model_entries(path, "--config")}
    if isinstance(data, dict):
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return DeploymentConfig.from_dict(data), data


def changed_server_keys(old: DeploymentConfig, new: DeploymentConfig) -> list[str]:
    """The server-level keys whose values differ (those a running server cannot take)."""
    before, after = old.model_dump(exclude={"models"}), new.model_dump(exclude={"models"})
    return sorted(k for k in after if before.get(k) != after[k])


class FileChanges:
    """Whether a file's content changed since the last look (its bytes compared): so that a file
    that did not change is not read, validated or reported again at every poll."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: bytes | None = None

    def note(self) -> None:
        """Take the file as it is now as seen (the deployment the server started with)."""
        self._seen = self._read()

    def changed(self) -> bool:
        data = self._read()
        if data is None or data == self._seen:
            return False
        self._seen = data
        return True

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            log.warning("deployment file %s: %s", self.path, exc)
            return None


class ModelSet:
    """See the module doc. ``runtime``: the server's
    :class:`~server.runtime.ServingRuntime`; ``read``: the deployment to apply now (raises
    ConfigError); ``path``: the file ``read`` reads (polled when ``poll_seconds`` > 0)."""

    def __init__(self, runtime: Any, read: Callable[[], DeploymentConfig] | None = None,
                 path: str | Path | None = None, poll_seconds: float = 0.0) -> None:
        self.runtime = runtime
        self._read = read
        self._file = FileChanges(path) if path is not None else None
        if self._file is not None:
            # the file as the server started with it, taken now (right after it was read), not
            # at start(): the ports may open first (models loaded before them), and a change a
            # client makes then must not become the baseline, never applied
            self._file.note()
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports: list[dict[str, Any]] = []  # the last few, newest last
        # models known and not served: name -> (their entry, why: "unloaded" or the load's error)
        self.unserved: dict[str, tuple[Any, str]] = {}

    # --- triggers ---------------------------------------------------------------------------

    @property
    def follows_file(self) -> bool:
        """Whether this set re-reads a deployment file (polled and on :meth:`request_reload`)."""
        return self._file is not None and self._read is not None

    def start(self) -> None:
        """Follow the file (polled, and on :meth:`request_reload`) on a daemon thread."""
        if not self.follows_file:
            return
        self._thread = threading.Thread(target=self._follow, daemon=True, name="sp-model-set")
        self._thread.start()

    def request_reload(self) -> None:
        """Re-read the file now (SIGHUP); safe from a signal handler's callback."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_seconds if self.poll_seconds > 0 else None)
            forced = self._wake.is_set()
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._file.changed() or forced:
                self.reload("SIGHUP" if forced else "file changed")

    def reload(self, trigger: str) -> dict[str, Any]:
        """Read the deployment and apply it; never raises (a bad file is logged and reported)."""
        try:
            new = self._read()
        except ConfigError as exc:
            log.error("deployment reload (%s) refused, the running models keep serving: %s", trigger,
                      exc.message)
            return self._report({"trigger": trigger, "error": exc.message})
        return self.apply(new, trigger)

    # --- applying -----------------------------------------------------------------------------

    def apply(self, new: DeploymentConfig, trigger: str = "request") -> dict[str, Any]:
        """Make the served models ``new``'s (see the module doc); returns the report."""
        return self.change(lambda running: new, trigger)

    def change(self, edit: Callable[[DeploymentConfig], DeploymentConfig], trigger: str = "request",
               reload: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Apply ``edit(running deployment)`` as :meth:`apply` does, the running deployment read
        under the set's lock (no other change comes between); ``edit`` may raise (a
        ProcessorError for its caller: nothing changed). The models named in ``reload`` are
        loaded anew even when their entry did not change."""
        with self._lock:
            rt = self.runtime
            old = rt.deployment
            new = edit(old)
            report: dict[str, Any] = {"trigger": trigger, "added": [], "removed": [], "replaced": [],
                                      "routing": [], "failed": {}, "not_applied": changed_server_keys(old, new)}
            if report["not_applied"]:
                log.warning("deployment reload: server keys %s change only with a restart; not applied",
                            report["not_applied"])
            before = {e.name: e for e in old.models}
            after = {e.name: e for e in new.models}
            for name in [n for n in before if n not in after]:
                model = rt.drop_model(name)
                report["removed"].append(name)
                log.info("deployment reload: model %s removed; it drains and unloads", name)
                if model is not None:
                    rt.retire_model(model)
            for name, entry in after.items():
                was = before.get(name)
                if was is not None and name not in reload and all(getattr(was, k) == getattr(entry, k)
                                                                  for k in _RELOADED):
                    if was.routing != entry.routing:
                        self._route(name, entry, report)
                    continue
                self._load(entry, replaces=was is not None, report=report)
            served = {m.name for m in rt.models}
            # what the server serves now: the new file's entries, where they serve
            kept = tuple(e for e in new.models if e.name in served and e.name not in report["failed"]) + tuple(
                before[n] for n in report["failed"] if n in before and n in served)
            rt.deployment = old.model_copy(update={"models": kept})
            self._remember(before, after, served, report)
            return self._report(report)

    def _remember(self, before: dict, after: dict, served: set[str], report: dict[str, Any]) -> None:
        """Keep :attr:`unserved` in step: a removed model is "unloaded", one that failed to load
        and is not served keeps its error; a served one is forgotten there."""
        unserved = dict(self.unserved)
        for name in report["removed"]:
            unserved[name] = (before[name], "unloaded")
        for name, error in report["failed"].items():
            if name not in served:
                unserved[name] = (after[name], error)
        for name in served:
            unserved.pop(name, None)
        self.unserved = unserved

    def _load(self, entry, replaces: bool, report: dict[str, Any]) -> None:
        rt, name = self.runtime, entry.name
        log.info("deployment reload: %s model %s", "loading a new" if replaces else "adding", name)
        try:
            model = compose_entry(entry, budget=rt.budget)
        except Exception as exc:  # a config the composition refuses (an unusable timeline path)
            report["failed"][name] = as_processor_error(exc).message
            return
        error = rt.start_model(model)
        if error is not None:
            report["failed"][name] = error.message
            model.close()  # whatever it had opened (a failed model serves nothing)
            return
        old = rt.put_model(model, entry)
        report["replaced" if old is not None else "added"].append(name)
        if old is not None:
            rt.retire_model(old)

    def _route(self, name: str, entry, report: dict[str, Any]) -> None:
        changes = entry.routing.model_dump()
        try:
            strict = not getattr(self.runtime.deployment, "allow_version_labels_for_unavailable_models", True)
            self.runtime.models.get(name).update_routing(changes, require_served=strict)
            report["routing"].append(name)
        except Exception as exc:
            report["failed"][name] = as_processor_error(exc).message

    def _report(self, report: dict[str, Any]) -> dict[str, Any]:
        report["time"] = time.time()
        if report.get("error") is None and any(report.get(k) for k in ("added", "removed", "replaced", "routing")):
            log.info("deployment reload (%s): added %s, removed %s, replaced %s, routing %s, failed %s",
                     report["trigger"], report["added"], report["removed"], report["replaced"],
                     report["routing"], report["failed"])
        self.reports = (self.reports + [report])[-8:]
        return report
