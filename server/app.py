"""Composition root: builds the runtime, the HTTP and gRPC servers, runs them, drains on SIGTERM.

``ServingApp(deployment).run()`` (what ``python -m server`` calls), in the main thread:

1. binds the ports (0 picks a free one; the bound ports are printed and, with ``ports_file``,
   written as JSON ``{"http": port, "grpc": port}``), starts gRPC and uvicorn at once; with TLS
   (server/tls.py) the certificate files are checked first, and the extra listeners
   (``http_plaintext_port``, ``grpc_plaintext_port``, ``health_port``) start alongside, and
   gRPC also listens on ``grpc_socket_path`` (a Unix socket) when set;
2. loads every model on background threads (readiness stays 503 until all are loaded; a model
   that fails is reported unready while the others serve); with ``load_first`` (a supervisor's
   worker; TF Serving's command line) the models load before the ports open;
3. on SIGTERM or SIGINT: readiness and gRPC health turn NOT_SERVING, new requests are refused
   with 503 / UNAVAILABLE, in-flight requests get up to ``drain_timeout_seconds`` to finish, then
   both servers stop and the models are closed. Exit status 0 after a clean drain, 1 when the
   timeout cut requests off. A second signal exits at once.

The protocols the servers speak are registered here, once (:data:`PROTOCOLS`: each protocol
package's ``PROTOCOL``, :mod:`server.protocols`): the HTTP app and the gRPC server take their
routes and services from that list, so the transports import no protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from processor.served_model import ModelRegistry

from . import cpu_policy, eas, kserve, tfserving
from .protocols import Protocol
from .runtime import ServingRuntime
from .settings import DeploymentConfig

log = logging.getLogger("server")

# The protocols the server speaks, each a package registering its HTTP routes and gRPC services
# (server/protocols.py); the transports serve them in this order (the HTTP fast path matches
# their inference URLs in it: ours first, the cheapest to tell apart).
PROTOCOLS: tuple[Protocol, ...] = (eas.PROTOCOL, tfserving.PROTOCOL, kserve.PROTOCOL)


class ServingApp:
    """See the module doc."""

    def __init__(self, deployment: DeploymentConfig, *, models: ModelRegistry | None = None,
                 ports_file: str | os.PathLike | None = None,
                 announce: Callable[[str], None] | None = None, worker: bool = False,
                 load_first: bool = False, protocols: Sequence[Protocol] = PROTOCOLS) -> None:
        self.deployment = deployment
        self.protocols = tuple(protocols)  # what both transports serve (their registrations)
        # a supervisor's worker (server/supervisor.py): ports shared with SO_REUSEPORT, models
        # loaded before the ports open (no request meets a loading worker)
        self.worker = worker
        # the models load (or fail) before the ports open: a worker's rule, and TF Serving's
        # (tensorflow_model_server, server/tfserving/cli.py)
        self.load_first = load_first or worker
        from .grpc.native_server import grpc_server_kind

        # before the server starts a thread: they inherit it
        cpu_policy.apply(deployment.cpu_scheduling)

        # before any model loads (TensorFlow); ConfigError naming grpc_server when "native" cannot serve
        self.grpc_server = grpc_server_kind(deployment.grpc_server, deployment.grpc_port is not None
                                            or deployment.grpc_socket_path is not None, deployment.grpc_tls_on,
                                            capped="max_connections" in deployment.model_fields_set)
        self.runtime = ServingRuntime(deployment, models)
        self.ports_file = Path(ports_file) if ports_file else None
        self.announce = announce or (lambda line: print(line, flush=True))
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        # TLS (issue 31): the extra plaintext listeners, bound ports or None
        self.http_plaintext_port: int | None = None
        self.grpc_plaintext_port: int | None = None
        self.health_port: int | None = None
        self.tls = None
        if deployment.tls_enabled:  # the files are checked now: ConfigError before any port opens
            from .tls import TlsCertificates

            self.tls = TlsCertificates(deployment)
        self._grpc = None
        self._health = None
        self._uvicorns: list = []
        self._asgi = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = threading.Event()  # set once the ports are bound and serving
        self._signals = 0
        self.exit_code = 0

    # --- run --------------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; return the process exit status.

        Uses uvloop's event loop when it is installed (the server extra installs it).
        """
        try:
            import uvloop
        except ImportError:
            return asyncio.run(self.serve())
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(self.serve())

    async def serve(self) -> int:
        dep = self.deployment
        loop = self._loop = asyncio.get_running_loop()
        self.runtime.cpu_meter.watch(threading.get_native_id())  # the HTTP loop: its load sheds shadow copies
        self._stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._on_signal, sig)
        model_set = self.runtime.model_set
        if model_set.follows_file:  # SIGHUP: re-read the deployment file (server/model_set.py)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, model_set.request_reload)

        if self.load_first:
            self.runtime.start_models()
            await loop.run_in_executor(None, self.runtime.wait_models)
        if self.worker:
            if self.runtime.admin_journal is not None:  # serve what the other workers serve
                await loop.run_in_executor(None, self.runtime.admin_journal.start)
        if dep.grpc_port is not None or dep.grpc_socket_path is not None:
            if self.grpc_server == "native":  # gRPC's C++ library (server/grpc/native_server.py)
                from .grpc.native_server import create_native_grpc_server as create_grpc_server
            else:
                from .grpc.server import create_grpc_server

            self._grpc, self.grpc_port, self._health = create_grpc_server(
                self.runtime, dep.host, dep.grpc_port, self._grpc_credentials(), self.protocols)
            if dep.grpc_plaintext_port is not None:
                self.grpc_plaintext_port = self._grpc.add_port(dep.host, dep.grpc_plaintext_port)
            if dep.grpc_socket_path is not None:  # TF Serving's --grpc_socket_path
                self._grpc.add_unix_socket(dep.grpc_socket_path, self._grpc_credentials())
            self._grpc.start()
        http_tasks = []
        for attr, port, tls, probes in self._http_listeners():
            sock = _bind(dep.host, port, reuse_port=self.worker)
            setattr(self, attr, sock.getsockname()[1])
            server = self._make_uvicorn(tls, probes)
            self._uvicorns.append(server)
            task = asyncio.create_task(server.serve(sockets=[sock]))
            http_tasks.append(task)
            while not server.started and not task.done():
                await asyncio.sleep(0.02)
            if task.done():
                task.result()  # raises the startup error
        if self.tls is not None:
            self.tls.start()
        self._write_ports()
        if not self.load_first:
            self.runtime.start_models()
        model_set.start()
        self.started.set()

        await self._stop.wait()
        await self._drain()
        for server, task in zip(self._uvicorns, http_tasks):
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.tls is not None:
            self.tls.stop()
        self.runtime.close()
        log.info("stopped", extra={"exit_code": self.exit_code})
        return self.exit_code

    def _grpc_credentials(self):
        """TLS credentials for one gRPC listener when the gRPC port speaks TLS, else None (one
        object per listener: each keeps its own state of the certificate reloads)."""
        if not self.deployment.grpc_tls_on:
            return None
        if self.grpc_server == "native":  # it reads the checked material (and its reloads)
            return self.tls
        from .tls import grpc_server_credentials

        return grpc_server_credentials(self.tls)

    def _http_listeners(self) -> list[tuple[str, int, bool, bool]]:
        """(attribute for the bound port, port, TLS, probes only) per HTTP listener."""
        dep = self.deployment
        out = []
        if dep.http_port is not None:
            out.append(("http_port", dep.http_port, dep.http_tls_on, False))
        if dep.http_plaintext_port is not None:
            out.append(("http_plaintext_port", dep.http_plaintext_port, False, False))
        if dep.health_port is not None:
            out.append(("health_port", dep.health_port, False, True))
        return out

    def _make_uvicorn(self, tls: bool = False, probes: bool = False):
        import uvicorn

        from .http.app import create_http_app
        from .http.protocol import limited_protocol

        class _Server(uvicorn.Server):
            # signals are ours (drain first); uvicorn must not install or re-raise them
            @contextlib.contextmanager
            def capture_signals(self):
                yield

            def install_signal_handlers(self) -> None:  # older uvicorn
                pass

        dep = self.deployment
        if self._asgi is None:  # one application behind every listener
            self._asgi = create_http_app(self.runtime, self.protocols)
        app = self._asgi
        if probes:
            from .http.health_port import probes_only

            app = probes_only(app)
        # the protocol enforces the header, read-timeout and connection limits (http/protocol.py)
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off",
            timeout_keep_alive=dep.keep_alive_timeout_seconds,
            timeout_graceful_shutdown=max(1, int(dep.drain_timeout_seconds)),
            server_header=False, http=limited_protocol(dep, None if probes else self._asgi.predict),
            ws="none", proxy_headers=False)
        if tls:  # our context (it follows certificate reloads), set where uvicorn keeps its own
            from .tls import HttpsContext

            config.load()
            config.ssl = HttpsContext(self.tls).context
        return _Server(config)

    def _write_ports(self) -> None:
        host = "127.0.0.1" if self.deployment.host in ("0.0.0.0", "::") else self.deployment.host
        dep = self.deployment
        if self.http_port is not None:
            scheme = "https" if dep.http_tls_on else "http"
            self.announce(f"HTTP  {scheme}://{host}:{self.http_port}  (docs: /docs, metrics: /metrics)")
        if self.grpc_port is not None:
            self.announce(f"gRPC  {host}:{self.grpc_port}{'  (TLS)' if dep.grpc_tls_on else ''}")
        if dep.grpc_socket_path is not None:
            self.announce(f"gRPC  unix:{dep.grpc_socket_path}")
        for name, port in (("HTTP plaintext", self.http_plaintext_port),
                           ("gRPC plaintext", self.grpc_plaintext_port), ("health", self.health_port)):
            if port is not None:
                self.announce(f"{name}  {host}:{port}")
        if self.ports_file is not None:
            tmp = self.ports_file.with_suffix(".tmp")
            ports = {"http": self.http_port, "grpc": self.grpc_port, "pid": os.getpid()}
            for key, port in (("http_plaintext", self.http_plaintext_port),
                              ("grpc_plaintext", self.grpc_plaintext_port), ("health", self.health_port)):
                if port is not None:
                    ports[key] = port
            tmp.write_text(json.dumps(ports))
            tmp.replace(self.ports_file)

    # --- shutdown ---------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal %s: exiting now", signal.Signals(sig).name)
            logging.shutdown()
            os._exit(1)
        log.info("%s received: draining (up to %.1f s)", signal.Signals(sig).name,
                 self.deployment.drain_timeout_seconds)
        self.request_stop()

    def request_stop(self) -> None:
        """Start the drain, as SIGTERM does; callable from any thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _drain(self) -> None:
        rt = self.runtime
        timeout = self.deployment.drain_timeout_seconds
        started = time.monotonic()
        rt.gate.start_draining()
        if self._health is not None:
            self._health.shutdown()
        in_flight = rt.gate.in_flight
        drained = await asyncio.get_running_loop().run_in_executor(None, rt.gate.wait_idle, timeout)
        waited = time.monotonic() - started
        if drained:
            log.info("drained %d in-flight request(s) in %.2f s", in_flight, waited)
        else:
            log.warning("drain timeout (%.1f s): %d request(s) still running are cut off",
                        timeout, rt.gate.in_flight)
            self.exit_code = 1
        for server in self._uvicorns:  # what uvicorn may still wait for on its own
            server.config.timeout_graceful_shutdown = 1 if drained else 0
        if self._grpc is not None:
            grace = 0.5 if drained else 0
            await asyncio.get_running_loop().run_in_executor(None, self._grpc.stop, grace)


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP; without
    # it, Nagle + delayed ACKs add 40 ms to every response written in two parts (uvicorn does)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # every worker listens on the port; the kernel spreads the connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind the HTTP port {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def configure(deployment: DeploymentConfig) -> None:
    from .logs import configure_logging

    configure_logging(deployment.log_format, deployment.log_level)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

