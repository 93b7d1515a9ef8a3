"""Start ``python -m server`` in a child process and wait until it serves (tests, benchmarks).

``ServerProcess(deployment_dict, workdir).start()`` writes the deployment JSON, starts the server
on free ports (``--http-port 0 --grpc-port 0``), reads the bound ports from ``--ports-file`` and
waits until every model has finished loading (loaded or failed). ``stop()`` sends SIGTERM and
waits for the exit; the child is killed if it outlives the timeout. Logs go to
``workdir/server.log``. With ``ssl_context`` (a client context) its own requests use HTTPS.

A server still running when this process exits (a test fixture that failed before its
``stop()``, a benchmark interrupted) is stopped then, not left behind.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
_running: set[ServerProcess] = set()  # started and not stopped yet: stopped at exit


class ServerProcess:
    """See the module doc."""

    def __init__(self, deployment: dict[str, Any], workdir: str | os.PathLike,
                 env: dict[str, str] | None = None, ssl_context: ssl.SSLContext | None = None,
                 prefix: list[str] | None = None) -> None:
        self.deployment = dict(deployment)
        self.prefix = list(prefix or ())  # a command that execs the server (e.g. into a cgroup)
        self.workdir = Path(workdir)
        self.env = env or {}
        self.ssl_context = ssl_context  # the client side when the HTTP port speaks TLS
        self.ports: dict[str, int] = {}  # every bound port, as the ports file names them
        self.proc: subprocess.Popen | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.log_path = self.workdir / "server.log"

    @property
    def http(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 120.0, wait_models: bool = True) -> ServerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "deployment.json"
        config.write_text(json.dumps(self.deployment))
        ports = self.workdir / "ports.json"
        ports.unlink(missing_ok=True)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "server", "--config", str(config), "--http-port", "0",
             "--grpc-port", "0", "--host", "127.0.0.1", "--ports-file", str(ports)],
            cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        _running.add(self)
        deadline = time.monotonic() + timeout
        while not ports.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"server did not bind its ports in {timeout} s; see {self.log_path}")
            time.sleep(0.05)
        bound = self.ports = json.loads(ports.read_text())
        self.http_port, self.grpc_port = bound["http"], bound["grpc"]
        if wait_models:
            self.wait_models(max(1.0, deadline - time.monotonic()))
        return self

    def wait_models(self, timeout: float) -> dict[str, str]:
        """Wait until no model is still new/loading/warming; returns their states."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            states = {m["name"]: m["state"] for m in self.get_json("/api/models")["models"]}
            if all(s not in ("new", "loading", "warming") for s in states.values()):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"models still loading after {timeout} s: {states}")
            time.sleep(0.1)

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.http + path, timeout=10, context=self.ssl_context) as resp:
            return json.loads(resp.read())

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"server exited with status {self.proc.returncode}; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait for the exit (kill after ``timeout``); returns the exit status."""
        if self.proc is None:
            return None
        _running.discard(self)
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        # `with ServerProcess(...).start(...) as proc` must not start a second server (the first
        # one would be left running)
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _stop_left_running() -> None:
    for server in list(_running):
        server.stop(timeout=10)


atexit.register(_stop_left_running)
