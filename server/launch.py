"""The run path both command lines share: ``python -m server`` / ``serving-processor``
(:mod:`server.__main__`) and ``tensorflow_model_server`` (:mod:`server.tfserving.cli`).

Each command line turns its arguments into a validated
:class:`~server.settings.DeploymentConfig` (and the JSON it was validated from), then calls
:func:`run`, which:

* configures logging, checks the admin token (a named variable that is unset: exit 2);
* with ``workers > 1`` supervises the workers (:mod:`server.supervisor`: each a ``python -m
  server`` of the JSON); else runs one :class:`~server.app.ServingApp`, a supervisor's worker
  with its shared memory and admin journal when it is one;
* follows the deployment's :class:`Source` (the live model set, :mod:`server.model_set`: the
  file polled every ``model_config_file_poll_wait_seconds`` and re-read on SIGHUP);
* serves until SIGTERM and ends the process with the exit status: 0 after a clean drain, 1 when
  the drain timeout cut requests off, 2 for a bad config or a port that cannot be bound.

:func:`hold_sighup` comes first of all: until the server handles SIGHUP (the live model set), it
must not end the process, its default action.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from processor.errors import ConfigError

from .app import ServingApp, configure
from .logs import JsonFormatter
from .runtime import tune_gc
from .settings import DeploymentConfig

log = logging.getLogger("server")


@dataclass(frozen=True)
class Source:
    """Where the served deployment comes from: ``path``, the file followed (polled, and re-read
    on SIGHUP); ``read()``, the deployment now, validated, and the JSON it was validated from
    (raises ConfigError)."""

    path: str
    read: Callable[[], tuple[DeploymentConfig, dict]]


@dataclass(frozen=True)
class Worker:
    """A supervisor's worker (server/supervisor.py passes these on the command line)."""

    server_id: str
    shm_dir: str | None = None
    admin_journal: str | None = None


def hold_sighup() -> None:
    """Ignore SIGHUP until the server handles it (imports, a worker's first loads)."""
    with contextlib.suppress(ValueError):  # not the main thread (a test calling main): no signals
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def bad_config(prog: str, exc: ConfigError) -> int:
    """Print a config error as every command line does; the exit status (2)."""
    print(f"{prog}: bad config: {exc.message}", file=sys.stderr)
    return 2


def run(deployment: DeploymentConfig, data: dict, *, prog: str, source: Source | None = None,
        ports_file: str | None = None, worker: Worker | None = None, load_first: bool = False,
        on_ready: Sequence[Callable[[ServingApp, str], None]] = (),
        cleanup: Sequence[Callable[[], None]] = ()) -> int:
    """Serve ``deployment`` (see the module doc); returns 2 for a bad config, else ends the
    process with the exit status. ``load_first``: the models load before the ports open (TF
    Serving's order); ``on_ready(app, name)``: called as each model is ready; ``cleanup()``:
    called before the process ends."""
    try:
        deployment.resolved_admin_token()  # a named variable that is unset fails here
    except ConfigError as exc:
        _clean(cleanup)
        return bad_config(prog, exc)
    configure(deployment)
    if deployment.admin_token is None and deployment.admin_token_env is None:
        if deployment.admin_allow_without_token:
            log.warning("admin endpoints open without a token to clients of this loopback host %s "
                        "(admin_allow_without_token)", deployment.host)
        else:
            log.info("admin endpoints disabled: no admin token configured (admin_token_env)")
    if deployment.workers > 1 and worker is None:
        from .supervisor import Supervisor

        return _run_and_exit(Supervisor(deployment, data, ports_file, source=source).run, cleanup)
    if worker is not None:  # the parameters of ONNX models go to the server's shared memory
        from processor import shared_segments

        shared_segments.enable(worker.server_id, worker.shm_dir)
        _tag_log_lines()
    try:
        app = ServingApp(deployment, ports_file=ports_file, worker=worker is not None, load_first=load_first,
                         announce=log.debug if worker is not None else None)  # the supervisor announces
    except ConfigError as exc:
        _clean(cleanup)
        return bad_config(prog, exc)
    if worker is not None and worker.admin_journal:  # admin actions reach every worker
        from .admin_journal import AdminJournal

        app.runtime.admin_journal = AdminJournal(worker.admin_journal, app.runtime)
    if source is not None:  # the live model set: the file re-read when it changes (a worker's: on SIGHUP)
        from .model_set import ModelSet

        app.runtime.model_set = ModelSet(
            app.runtime, lambda: source.read()[0], source.path,
            0.0 if worker is not None else deployment.model_config_file_poll_wait_seconds)
    app.runtime.on_model_ready.append(lambda name: tune_gc())
    for callback in on_ready:
        app.runtime.on_model_ready.append(lambda name, callback=callback: callback(app, name))
    return _run_and_exit(app.run, cleanup)


def _clean(cleanup: Sequence[Callable[[], None]]) -> None:
    for step in cleanup:
        with contextlib.suppress(Exception):
            step()


def _tag_log_lines() -> None:
    """A worker's JSON log lines (the access log's included) say which worker wrote them. The
    formatter adds the pid, not a filter: a filter on the handler would send the access log's
    lines through ``logging`` one by one (server/access_log.py)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.worker = os.getpid()


def _run_and_exit(serve: Callable[[], int], cleanup: Sequence[Callable[[], None]] = ()) -> Any:
    """Run the server (``serve()``: its exit status) and end the process with that status."""
    try:
        code = serve()
    except OSError as exc:  # a port in use: exit without waiting for the threads already started
        log.error("cannot start: %s", exc)
        code = 2
    _clean(cleanup)
    # Everything is closed. Skip the interpreter's teardown: TensorFlow's and gRPC's destructors
    # take seconds, and after a cut-off drain, worker threads may still be running requests.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
