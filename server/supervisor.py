"""Supervisor: N worker processes (each a whole :class:`~server.app.ServingApp`) on the same ports.

``workers: N`` (or ``--workers N``), N > 1, makes ``python -m server`` this supervisor
(issue 24). It serves nothing itself:

1. cleans the files stale servers left in ``/dev/shm`` and takes its server id and lock
   (:class:`processor.shared_segments.ServerLock`);
2. reserves every port once (0 picks a free one): a socket bound, not listening, first without
   ``SO_REUSEPORT`` (so a port another program holds is an error, as with one process) and then
   with it, kept until the end so that the port stays ours while workers come and go;
3. starts N workers (``python -m server --worker-of ID``) with the resolved ports. Each binds
   the same ports with ``SO_REUSEPORT`` (HTTP: its own socket; gRPC: ``grpc.so_reuseport``), so
   the kernel spreads connections over the workers' listening sockets. A worker loads its models
   before it listens, so no request meets a loading worker. ``PROMETHEUS_MULTIPROC_DIR`` is set
   in its environment (server/metrics.py: ``/metrics`` counts the requests of every worker);
   the parent-death signal (SIGTERM) stops a worker whose supervisor was killed;
4. once every worker listens, prints the ports and writes ``--ports-file`` (``pid``: the
   supervisor's, ``workers``: the workers' pids);
5. restarts a worker that exits while the server runs (logged with its status; restarts of a
   worker that keeps dying at once are spaced out, up to 30 s), the others serving meanwhile;
   the ports file is rewritten with the new pid once the new worker listens;
6. admin actions reach every worker through the admin journal in the run directory
   (server/admin_journal.py), a restarted worker included;
7. the live model set (server/model_set.py): the deployment file is re-read when it changes
   (every ``model_config_file_poll_wait_seconds``) and on SIGHUP; a valid new one is written
   over the workers' copy (the ports they share kept) and each worker is sent SIGHUP to apply it,
   so every worker follows and a worker restarted later starts from it; an invalid one is logged
   and changes nothing;
8. SIGTERM / SIGINT: forwarded to every worker, each drains within ``drain_timeout_seconds``;
   a worker still alive 10 s after that is killed. Exit status: 0 when every worker drained
   cleanly, 1 otherwise. A second signal is forwarded too (the workers exit at once) and the
   supervisor exits 1. At the end it removes its shared-memory files, its metrics directory
   and its run directory.

Single-threaded: signals only set flags; the main loop does the rest.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from processor import shared_segments
from processor.errors import ConfigError

from .model_set import FileChanges
from .settings import DeploymentConfig

log = logging.getLogger("server")

PORT_KEYS = ("http_port", "grpc_port", "http_plaintext_port", "grpc_plaintext_port", "health_port")
_PORTS_FILE_NAMES = {"http_port": "http", "grpc_port": "grpc", "http_plaintext_port": "http_plaintext",
                     "grpc_plaintext_port": "grpc_plaintext", "health_port": "health"}
_KILL_MARGIN_SECONDS = 10.0
_MAX_RESTART_DELAY_SECONDS = 30.0
_QUICK_DEATH_SECONDS = 5.0  # a worker dying sooner than this after its start: back off


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port), not listening, in the SO_REUSEPORT group."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))  # without SO_REUSEPORT: a port held by anyone else is refused
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind the port {host}:{port}: {exc.strerror}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the supervisor dies (Linux prctl)."""
    with_libc = ctypes.CDLL(None, use_errno=True)
    with_libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.restarts = 0
        self.next_start = 0.0  # monotonic time of a delayed restart
        self.delay = 0.0


class Supervisor:
    """See the module doc. ``data``: the deployment as validated (ports overridden already)."""

    def __init__(self, deployment: DeploymentConfig, data: dict[str, Any],
                 ports_file: str | os.PathLike | None = None,
                 announce: Callable[[str], None] | None = None, source: Any = None) -> None:
        self.deployment = deployment
        self.data = dict(data)
        # the live model set: the file the server was started with (a server.launch.Source: its
        # path and its reader, the command line's keys applied)
        self._source = FileChanges(source.path) if source is not None else None
        self._read = source.read if source is not None else None
        self._hup = False
        self._next_poll = 0.0
        self.ports_file = Path(ports_file) if ports_file else None
        self.announce = announce or (lambda line: print(line, flush=True))
        self.ports: dict[str, int] = {}
        self._reserved: list[socket.socket] = []
        self._workers = [_Worker(i) for i in range(deployment.workers)]
        self._signals = 0
        self._stopping = False
        self.exit_code = 0

    # --- start ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; return the exit status. OSError: a port cannot be bound."""
        dep = self.deployment
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        if self._source is not None:
            self._source.note()
            signal.signal(signal.SIGHUP, self._on_hup)
        self._lock = shared_segments.ServerLock()
        if self._lock.removed_stale:
            log.info("removed %d shared-memory file(s) of servers that died without cleaning up",
                     len(self._lock.removed_stale))
        self._run_dir = Path(tempfile.mkdtemp(prefix="sp-supervisor-"))
        self._metrics_dir = self._run_dir / "metrics"
        self._metrics_dir.mkdir()
        try:
            for key in PORT_KEYS:
                port = getattr(dep, key)
                if port is not None:
                    sock = reserve_port(dep.host, port)
                    self._reserved.append(sock)
                    self.ports[key] = self.data[key] = sock.getsockname()[1]
            self._config = self._run_dir / "deployment.json"
            self._config.write_text(json.dumps(self.data))
            log.info("supervisor %d: starting %d workers", os.getpid(), dep.workers,
                     extra={"shared_memory": str(self._lock.directory)})
            for worker in self._workers:
                self._start(worker)
            if self._wait_listening():
                self._write_ports()
            self._watch()
        finally:
            self._stop_all()
            self._cleanup()
        log.info("stopped", extra={"exit_code": self.exit_code})
        return self.exit_code

    def _worker_ports_file(self, worker: _Worker) -> Path:
        return self._run_dir / f"worker-{worker.index}.json"

    def _start(self, worker: _Worker) -> None:
        ports = self._worker_ports_file(worker)
        ports.unlink(missing_ok=True)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self._metrics_dir)}
        cmd = [sys.executable, "-m", "server", "--config", str(self._config), "--ports-file", str(ports),
               "--worker-of", self._lock.server_id, "--shm-dir", str(self._lock.directory),
               "--admin-journal", str(self._run_dir / "admin.jsonl")]
        # its own session: a terminal's Ctrl-C (or `timeout`) signals the process group, and the
        # workers must get the signal once, from here
        worker.proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent, start_new_session=True)
        worker.started = time.monotonic()
        log.info("worker %d started (pid %d%s)", worker.index, worker.proc.pid,
                 f", restart {worker.restarts}" if worker.restarts else "")

    def _wait_listening(self) -> bool:
        """Wait until every worker has written its ports file (it listens); False: stopping.

        A worker that exits before it listens (a port it cannot bind, a bad certificate) ends
        the start: the others are stopped and the server exits with that worker's status."""
        pending = list(self._workers)
        while pending and not self._stopping:
            for worker in pending:
                code = worker.proc.poll()
                if code is not None:
                    log.error("worker %d exited with status %s before it listened: stopping", worker.index, code)
                    self.exit_code = code if code > 0 else 1
                    self._stopping = True
                    return False
            pending = [w for w in pending if not self._worker_ports_file(w).exists()]
            time.sleep(0.05)
        return not self._stopping

    def _write_ports(self, announce: bool = True) -> None:
        host = "127.0.0.1" if self.deployment.host in ("0.0.0.0", "::") else self.deployment.host
        for key, port in self.ports.items() if announce else ():
            self.announce(f"{_PORTS_FILE_NAMES[key]}  {host}:{port}  ({self.deployment.workers} workers)")
        if self.ports_file is not None:
            data: dict[str, Any] = {_PORTS_FILE_NAMES[k]: p for k, p in self.ports.items()}
            data.setdefault("http", None)
            data.setdefault("grpc", None)
            data["pid"] = os.getpid()
            data["workers"] = [w.proc.pid for w in self._workers if w.proc is not None]
            tmp = self.ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.ports_file)

    # --- watch ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        joining: list[_Worker] = []  # restarted, not listening yet
        while not self._stopping:
            self._reap()
            now = time.monotonic()
            for worker in self._workers:
                if worker.proc is None and now >= worker.next_start and not self._stopping:
                    worker.restarts += 1
                    self._start(worker)
                    joining.append(worker)
            listening = [w for w in joining if w.proc is not None and self._worker_ports_file(w).exists()]
            if listening:
                for worker in listening:
                    log.info("worker %d (pid %d) serves again", worker.index, worker.proc.pid)
                joining = [w for w in joining if w not in listening]
                self._write_ports(announce=False)  # the new pids
            self._follow_config(now)
            time.sleep(0.1)

    def _follow_config(self, now: float) -> None:
        """Re-read the deployment file when it changed (polled) or on SIGHUP; hand a valid one to
        every worker (see the module doc)."""
        poll = self.deployment.model_config_file_poll_wait_seconds
        if self._source is None or not (self._hup or (poll > 0 and now >= self._next_poll)):
            return
        forced, self._hup = self._hup, False
        self._next_poll = now + poll
        if not (self._source.changed() or forced):
            return
        try:
            _, data = self._read()
        except ConfigError as exc:
            log.error("deployment reload refused, the workers keep their models: %s", exc.message)
            return
        for key in PORT_KEYS:  # the ports the workers share stay the reserved ones
            if key in self.data:
                data[key] = self.data[key]
        staging = self._config.with_suffix(".new")
        staging.write_text(json.dumps(data))
        os.replace(staging, self._config)
        self.data = data
        log.info("deployment file changed: the workers apply it")
        self._forward(signal.SIGHUP)

    def _on_hup(self, _sig: int, _frame: Any) -> None:
        self._hup = True

    def _reap(self) -> None:
        """Notice workers that exited; schedule their restart (not while stopping)."""
        for worker in self._workers:
            proc = worker.proc
            if proc is None or proc.poll() is None or self._stopping:
                continue
            code = proc.returncode
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            lived = time.monotonic() - worker.started
            worker.delay = (min(_MAX_RESTART_DELAY_SECONDS, max(1.0, 2 * worker.delay))
                            if lived < _QUICK_DEATH_SECONDS else 0.0)
            worker.next_start = time.monotonic() + worker.delay
            log.error("worker %d (pid %d) died (%s) after %.1f s; restarting it%s", worker.index, proc.pid,
                      how, lived, f" in {worker.delay:.0f} s" if worker.delay else "")
            self._mark_dead(proc.pid)
            worker.proc = None

    # --- stop -----------------------------------------------------------------------------------

    def _on_signal(self, sig: int, _frame: Any) -> None:
        self._signals += 1
        self._stopping = True
        if self._signals == 1:
            log.info("%s received: draining %d workers (up to %.1f s)", signal.Signals(sig).name,
                     len(self._workers), self.deployment.drain_timeout_seconds)
        self._forward(sig)
        if self._signals > 1:
            log.warning("second signal %s: workers exit now", signal.Signals(sig).name)
            self.exit_code = 1

    def _forward(self, sig: int) -> None:
        for worker in self._workers:
            if worker.proc is not None and worker.proc.poll() is None:
                try:
                    worker.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _stop_all(self) -> None:
        self._stopping = True
        if self._signals == 0:  # an error or a failed start ended the watch: the workers stop too
            self._forward(signal.SIGTERM)
        deadline = time.monotonic() + self.deployment.drain_timeout_seconds + _KILL_MARGIN_SECONDS
        for worker in self._workers:
            proc = worker.proc
            if proc is None:
                continue
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) still running after the drain: killed", worker.index, proc.pid)
                proc.kill()
                code = proc.wait()
            if code != 0:
                self.exit_code = self.exit_code or 1

    def _mark_dead(self, pid: int) -> None:
        """Drop a dead worker's live gauges from the multiprocess metrics (its counters stay)."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(self._metrics_dir))

    def _cleanup(self) -> None:
        for sock in self._reserved:
            sock.close()
        removed = self._lock.remove()
        if removed:
            log.info("removed %d shared-memory file(s) at stop", len(removed))
        shutil.rmtree(self._run_dir, ignore_errors=True)
