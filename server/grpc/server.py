"""The gRPC front-end (grpcio): thin transport over :class:`~server.runtime.ServingRuntime`.

Services: each protocol's (the registrations the composition root hands over,
:mod:`server.protocols`): our ``tensorflow.eas.ProcessorService`` (:mod:`server.eas.grpc_service`),
TF Serving's ``PredictionService`` and ``ModelService`` (:mod:`server.tfserving.grpc_service`),
KServe v2's ``inference.GRPCInferenceService`` (:mod:`server.kserve.grpc_service`), each under
the server's interceptor; TensorFlow's ``ProfilerService`` (:mod:`server.tfserving.profiler`,
with ``enable_profiler``), forwarded outside it. And:

* Admin methods (KServe v2's model repository, TF Serving's ``HandleReloadConfigRequest``): each
  is checked by the server's :class:`~server.http.admin.AdminGate` (:class:`GrpcAdminGate`, handed
  to every protocol: the token in the ``authorization`` (``Bearer <token>``) or ``x-admin-token``
  metadata, a verified client certificate with ``admin_client_cert``): UNAUTHENTICATED without
  a token, PERMISSION_DENIED with a wrong one or none configured; each call is logged with the
  caller's address and runs on the default executor. Like the HTTP admin routes they are not
  counted in the request metrics.
* ``grpc.health.v1.Health``: ``""`` is SERVING when every model is ready; each protocol's service
  names when at least one model is; each model name when that model is; all NOT_SERVING while
  draining.

Concurrency: the server is ``grpc.aio``, on an event loop of its own thread (:class:`GrpcServer`).
Every call of ours goes through one interceptor (:mod:`.interceptor`: request id, parsing,
drain gate, metrics, access log, the one error mapping), and each model's work runs as on HTTP
(``ServingRuntime.dispatch``): a small request to a model that runs in place right on the loop
(the engine takes tens of microseconds, less than a hop to a thread), any other on that model's
own pool, so a slow model's queue never holds another model's calls. Messages over
``max_request_bytes`` are refused by gRPC itself with RESOURCE_EXHAUSTED. Request ids travel in
the ``x-request-id`` metadata (returned in the trailing metadata).

Limits (deployment keys): request metadata over ``max_header_bytes`` is refused by gRPC,
connections beyond ``max_connections`` are not accepted, ``grpc_max_concurrent_streams`` streams
per connection, and beyond ``grpc_max_concurrent_rpcs`` calls in progress a call gets
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc

from ..http.admin import AdminGate
from ..protocols import Protocol
from ..repository import off_loop
from ..runtime import ServingRuntime
from .interceptor import EdgeInterceptor, Method, Service, metadata_values

log = logging.getLogger("server.grpc")


class GrpcAdminGate:
    """The admin check of gRPC calls: the server's :class:`~server.http.admin.AdminGate` (the
    one rule the HTTP admin API is checked by) over a call's metadata and peer certificate."""

    _CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}

    def __init__(self, gate: AdminGate) -> None:
        self.gate = gate

    async def call(self, context: grpc.aio.ServicerContext, action: str, target: str,
                   fn: Callable[[str], Any], refused: Callable[[], Any]) -> Any:
        """``fn(caller)`` on the default executor when the gate lets the call in (logged with the
        caller), its result the response; else the call's status is UNAUTHENTICATED or
        PERMISSION_DENIED with the gate's message (logged), and ``refused()`` (an empty response
        message) is returned with it."""
        caller = context.peer() or "unknown"
        authorization, token = metadata_values(context, _ADMIN_METADATA, 2)
        denied = self.gate.check(authorization or "", token or "", _cert_names(context))
        if denied is not None:
            status, message = denied
            log.warning("admin %s of %s by %s refused (%d): %s", action, target, caller, status, message,
                        extra={"client": caller, "model": target})
            context.set_code(self._CODES[status])
            context.set_details(message)
            return refused()
        log.info("admin %s of %s requested by %s", action, target, caller, extra={"client": caller, "model": target})
        return await off_loop(fn, caller)


_ADMIN_METADATA = {"authorization": 0, "x-admin-token": 1}


def _cert_names(context: grpc.aio.ServicerContext) -> tuple[str, ...] | None:
    """The names (subject CN, SANs) of the caller's verified client certificate; None without one."""
    auth = context.auth_context() or {}
    names = [*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())]
    return tuple(n.decode("latin-1") if isinstance(n, bytes) else n for n in names) if names else None


def services(rt: ServingRuntime, protocols: Sequence[Protocol]) -> list[Service]:
    """Every service of the ``protocols`` (in order; TF Serving's only when its messages are
    installed), their admin methods behind one :class:`GrpcAdminGate`."""
    admin = GrpcAdminGate(AdminGate.of(rt))
    return [service for protocol in protocols if protocol.grpc is not None for service in protocol.grpc(rt, admin)]


class GrpcServer:
    """A ``grpc.aio`` server on an event loop of its own thread, driven from any other thread,
    serving the ``protocols``' services.

    ``start`` / ``add_port`` / ``stop`` block until the loop has done them; :meth:`submit` runs
    a coroutine there. The HTTP server's loop and this one never wait on each other."""

    def __init__(self, rt: ServingRuntime, protocols: Sequence[Protocol]) -> None:
        dep = rt.deployment
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sp-grpc", daemon=True)
        self._thread.start()
        rt.cpu_meter.watch(self._thread.native_id)  # its load sheds shadow copies
        ours = services(rt, protocols)
        raw = [handler for protocol in protocols if protocol.grpc_raw is not None for handler in protocol.grpc_raw(rt)]
        methods: dict[str, Method] = {}
        for service in ours:
            methods.update(service.methods())

        async def create() -> grpc.aio.Server:  # grpc.aio binds a server to the running loop
            return grpc.aio.server(
                # the raw handlers (TensorFlow's profiler): forwarded as they came, outside the interceptor
                handlers=[*(service.generic_handler() for service in ours), *raw],
                interceptors=[EdgeInterceptor(rt, methods)],
                options=grpc_options(dep),
                maximum_concurrent_rpcs=dep.grpc_max_concurrent_rpcs)
        self.server = self.run(create())
        self._listeners: list[str] = []

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        """Run ``coro`` on the server's loop; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        """Run ``coro`` on the server's loop and wait for its result (not from that loop)."""
        return self.submit(coro).result(timeout)

    def add_port(self, host: str, port: int, credentials: grpc.ServerCredentials | None = None) -> int:
        """Bind one more port (TLS with ``credentials``, else plaintext); returns the bound port."""
        return self._add(f"{_grpc_host(host)}:{port}", credentials, f"port {host}:{port}")

    def add_unix_socket(self, path: str, credentials: grpc.ServerCredentials | None = None) -> None:
        """Listen on the Unix domain socket ``path`` too (TF Serving's ``--grpc_socket_path``;
        a stale socket file there is replaced); OSError when it cannot be bound."""
        self._add(f"unix:{path}", credentials, f"socket {path}")

    def _add(self, address: str, credentials: grpc.ServerCredentials | None, what: str) -> int:
        async def add() -> int:
            if credentials is None:
                return self.server.add_insecure_port(address)
            return self.server.add_secure_port(address, credentials)
        try:
            bound = self.run(add())
        except RuntimeError as exc:  # grpc.aio raises where the sync server returned 0
            raise OSError(f"cannot bind the gRPC {what}: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot bind the gRPC {what}")
        self._listeners.append(address)
        return bound

    def start(self) -> None:
        self.run(self.server.start())
        log.info("Python gRPC server (grpcio %s) on %s", grpc.__version__, ", ".join(self._listeners))

    def stop(self, grace: float | None, timeout: float = 10.0) -> None:
        """Stop accepting calls, give those in progress ``grace`` seconds (None: cancel them
        now), then end the loop's thread. Idempotent."""
        if not self._thread.is_alive():
            return
        try:
            self.run(self.server.stop(grace), timeout)
        except concurrent.futures.TimeoutError:
            log.warning("the gRPC server did not stop within %.1f s", timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


class Health:
    """Keeps the standard health service in step with the models (polls every ``interval``);
    ``names``: the protocols' service names it reports."""

    def __init__(self, rt: ServingRuntime, server: GrpcServer, names: Sequence[str] = (),
                 interval: float = 0.5) -> None:
        self.rt = rt
        self.server = server
        self.names = tuple(names)
        self.servicer = None
        self._task: concurrent.futures.Future | None = None
        try:
            from grpc_health.v1 import health, health_pb2_grpc
        except ImportError as exc:
            log.warning("gRPC health service disabled: %s (pip install grpcio-health-checking)", exc)
            return
        self.servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server.server)
        server.run(self._update())
        rt.on_model_ready.append(lambda name: server.submit(self._update()))
        self._task = server.submit(self._loop(interval))

    async def _update(self) -> None:
        if self.servicer is None:
            return
        from grpc_health.v1 import health_pb2

        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        ready = self.rt.readiness()
        await self.servicer.set("", serving if ready and all(ready.values()) else not_serving)
        any_ready = serving if any(ready.values()) else not_serving
        for service in self.names:
            await self.servicer.set(service, any_ready)
        for name, ok in ready.items():
            await self.servicer.set(name, serving if ok else not_serving)

    async def _loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self._update()

    def shutdown(self) -> None:
        """Every service NOT_SERVING from now on (the drain); thread-safe, idempotent."""
        if self._task is not None:
            self._task.cancel()
        if self.servicer is not None and self.server.loop.is_running():
            self.server.run(self.servicer.enter_graceful_shutdown())


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (the server extra installs it; measured: a fifth more
    batch-1 calls a second than asyncio's own loop on this path), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def create_grpc_server(rt: ServingRuntime, host: str, port: int | None,
                       credentials: grpc.ServerCredentials | None = None,
                       protocols: Sequence[Protocol] = ()) -> tuple[GrpcServer, int | None, Health]:
    """A started-later :class:`GrpcServer` of the ``protocols``' services (their registrations,
    server/protocols.py) bound to ``host:port`` (0: a free port; None: no TCP port, a Unix socket
    only); returns the port. With ``credentials`` (server/tls.py) the port speaks TLS."""
    server = GrpcServer(rt, protocols)
    health = Health(rt, server, [name for protocol in protocols for name in protocol.grpc_health])
    return server, None if port is None else server.add_port(host, port, credentials), health


def grpc_options(dep) -> list[tuple[str, int | str]]:
    """The server's channel arguments: message size, metadata size and connection limits, then
    the deployment's ``grpc_channel_arguments`` (a key given there replaces ours)."""
    ours = dict(_limits(dep))
    ours.update(dep.grpc_channel_arguments)
    return list(ours.items())


def _limits(dep) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", dep.max_request_bytes),
        ("grpc.max_send_message_length", -1),
        # off: a port in use is an error; on for a supervisor's workers, which share the port
        ("grpc.so_reuseport", 1 if dep.workers > 1 else 0),
        # soft and hard limit alike: metadata over it is refused, never "sometimes"
        ("grpc.max_metadata_size", dep.max_header_bytes),
        ("grpc.absolute_max_metadata_size", dep.max_header_bytes),
        ("grpc.max_concurrent_streams", dep.grpc_max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", dep.max_connections),
    ]


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
