"""The native gRPC server (issue 50, ``grpc_server: "native"``): gRPC's C++ library serves the
gRPC port; our ``tensorflow.eas.ProcessorService/Predict``, TF Serving's
``PredictionService/Predict`` and KServe v2's ``ModelInfer`` run on the direct path with no
Python and no GIL where they can, and every other call reaches the same Python handlers as on the
Python server through one generic bridge.

The native part is ``server.grpc._native_grpc`` (``native/grpc_server/``, built by
scripts/build_native.sh when gRPC's C++ library, Debian's ``libgrpc++-dev``, is installed). Its
server runs one ``CallbackGenericService``: raw request bytes, no generated stubs. For each call:

* **The direct path**: a Predict (of a protocol the deployment serves) to a model that batches on
  the native engine and whose plan is plain (:attr:`~processor.dataplane.plan.Plan.plain`: no
  timeline, prediction log, shadow or traffic split), naming no version or label (ours:
  ``x-model-version`` / ``x-model-label``; TF Serving: ``model_spec.version`` /
  ``version_label``, and a signature other than the default; v2: a ``model_version`` other than
  the served one), with a request that is not the empty introspection ping (TF Serving's and v2's
  of the plain form, ``native/grpc_server/transcode.h``, transcoded into ours: raw or typed
  tensors, raw v2 contents, no parameters), while the server is not draining and
  OpenTelemetry tracing is off: the gRPC thread queues the request bytes, with the call's
  deadline, on the model's default version's batching queue through the C table the C ABI's shim
  uses (``native/src/direct_api.h``, its asynchronous ``submit``), and the batch thread that ran
  the batch sends the answer (no thread waits for a batch; a call whose deadline passed before
  its batch ran is dropped unrun and answered DEADLINE_EXCEEDED with the queue's message, counted
  in the metrics and access log); the answer goes back (TF Serving's and v2's transcoded from ours
  as their Python handlers write them: the default signature's name, the model's
  ``enable_serialization_as_tensor_content``, the request's ``id``) with ``x-request-id``
  (trailing; the client's when sane, else a new one) and, for ours, ``x-model-version`` (initial). :class:`DirectRoutes`
  publishes each model's route, one ``DirectFront`` per published default version (so the version
  an answer names is the one that ran it), following the DataPlane's plans. Whatever the direct
  path does not take (a full queue, a lane closed for an update, a request the queue hands back)
  continues on the bridge, so Python answers it exactly, errors included.
* **The bridge**: everything else (the Predicts otherwise, TF Serving's Classify, Regress,
  metadata and ModelService, KServe v2's other methods, the health service, TensorFlow's profiler
  forward): the call's bytes,
  metadata, peer and deadline are posted to this server's event loop (an eventfd), which runs the
  method's handler exactly as the Python server does: through the same
  :class:`~server.grpc.interceptor.EdgeInterceptor` (request id, parsing, drain gate, metrics,
  access log, the one error mapping), with a :class:`NativeContext` for ``grpc.aio``'s
  ``ServicerContext``. Unary-unary and unary-stream methods (the health service's ``Watch``) are
  served; a method whose requests stream (none is registered today) is UNIMPLEMENTED, saying so.

What the direct path answered is counted natively and folded into the server's metrics (the same
``sp_requests`` / ``sp_request_latency_seconds`` series, protocol ``grpc``) and access log every :data:`FOLD_SECONDS` (api ``predict``, ``tfs_predict``, ``v2_infer``), with
``sp_grpc_native_calls{path}`` (direct, bridged); the in-flight gauge counts bridged calls only.

Limits as on the Python server (:func:`~server.grpc.server.grpc_options`: message and metadata
sizes, streams per connection, ``SO_REUSEPORT`` with workers, the deployment's
``grpc_channel_arguments``), ``grpc_max_concurrent_rpcs`` (RESOURCE_EXHAUSTED beyond it), TLS and
mTLS through gRPC's SSL server credentials with a certificate fetcher (new handshakes get the
material server/tls.py reloads). Not ``max_connections`` (gRPC 1.51 has no such argument): a
deployment that sets it is served by the Python server (:func:`grpc_server_kind`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import grpc

from processor.echo import shorten
from processor.errors import ConfigError
from processor.request import version_number

from .. import cpu_policy
from ..access_log import AccessLog
from ..protocols import Protocol
from ..runtime import ServingRuntime
from .interceptor import EdgeInterceptor, Method
from .native_bridge import HandlerSet, NativeContext, _Aborted, _Details
from .server import Health, _grpc_host, _new_loop, grpc_options, services

log = logging.getLogger("server.grpc")

KEY = "grpc_server"
FOLD_SECONDS = 0.5  # the direct path's counts into the metrics and access log, new models followed
_OK = grpc.StatusCode.OK
_STREAMING_REQUESTS = ("streaming requests are not served by the native gRPC server (grpc_server: "
                       "\"native\"); grpc_server: \"python\" serves them")


def grpc_server_kind(choice: str, serves_grpc: bool = True, tls: bool = False, capped: bool = False) -> str:
    """What serves the gRPC port for the deployment's ``grpc_server`` ``choice``: "native" or
    "python" ("auto": native where it can serve). ``capped``: the deployment sets
    ``max_connections``, which only the Python server enforces (gRPC 1.51's C++ server has no cap
    on connections), so "auto" picks it. Call it before any model is loaded: it loads the native
    server, whose gRPC library must bind its OpenSSL calls before TensorFlow is loaded (see
    :func:`native_module`). ConfigError naming the key for "native" when it cannot serve."""
    if choice == "python" or not serves_grpc:
        return choice if choice != "auto" else "python"
    if capped:
        if choice == "native":
            raise ConfigError(
                f'{KEY}: "native" cannot enforce max_connections (the C++ server of gRPC 1.51 has no cap on '
                f'connections); leave max_connections unset, or set {KEY}: "python", which enforces it')
        log.info('grpc_server "auto": the Python gRPC server serves gRPC (it enforces max_connections)')
        return "python"
    try:
        native_module(tls)
    except ConfigError as exc:
        if choice == "native":
            raise
        log.info('grpc_server "auto": the Python gRPC server serves gRPC (%s)', exc.message.split(" (")[0])
        return "python"
    return "native"


_after_tensorflow: bool | None = None  # the native server was first loaded after TensorFlow


def native_module(tls: bool = False) -> Any:
    """``server.grpc._native_grpc``; ConfigError naming the key when it is not built, or, for
    ``tls``, when it was first loaded after TensorFlow: TensorFlow's library exports its bundled
    BoringSSL's symbols process-wide, and gRPC's library (Debian's, built on OpenSSL) then binds
    its OpenSSL calls to them and crashes when it makes its first TLS context. Loaded first
    (``python -m server`` loads it before any model), it binds them to OpenSSL for good."""
    global _after_tensorflow
    if _after_tensorflow is None:
        _after_tensorflow = _tensorflow_loaded()
    try:
        from . import _native_grpc
    except ImportError as exc:
        raise ConfigError(
            f'{KEY}: "native" needs the native gRPC server, server/grpc/_native_grpc, which is not built '
            f"for this Python ({exc}); install gRPC's C++ library (Debian: apt-get install libgrpc++-dev; "
            f'scripts/setup.sh does) and run scripts/build_native.sh, or set {KEY}: "python"') from None
    if tls and _after_tensorflow:
        raise ConfigError(
            f'{KEY}: "native" with TLS needs the native gRPC server loaded before TensorFlow (this process '
            f"loaded TensorFlow first, whose BoringSSL symbols gRPC's OpenSSL calls would reach); start the "
            f'server with python -m server, which loads it first, or set {KEY}: "python"')
    return _native_grpc


def _tensorflow_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            return any("libtensorflow_framework" in line for line in maps)
    except OSError:  # no /proc: judge by the module
        return "tensorflow" in sys.modules


class NativeGrpcServer:
    """The native server, driven like :class:`~server.grpc.server.GrpcServer` (``add_port``,
    ``add_unix_socket``, ``start``, ``stop``, ``run``, ``submit``, ``loop``; ``server``: where
    services register, for the health service); its bridge runs on an event loop of its own
    thread. See the module doc."""

    def __init__(self, rt: ServingRuntime, protocols: Sequence[Protocol]) -> None:
        native = native_module()
        dep = rt.deployment
        self.rt = rt
        self.native = native.Server(list(grpc_options(dep)), dep.grpc_max_concurrent_rpcs,
                                    [float(b) for b in rt.metrics.latency._upper_bounds[:-1]],
                                    io_threads_batch=cpu_policy.io_threads_batch(dep.cpu_scheduling))
        self._mod = native
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sp-grpc", daemon=True)
        self._thread.start()
        rt.cpu_meter.watch(self._thread.native_id)
        ours = services(rt, protocols)
        raw = [handler for protocol in protocols if protocol.grpc_raw is not None for handler in protocol.grpc_raw(rt)]
        methods: dict[str, Method] = {}
        for service in ours:
            methods.update(service.methods())
        self.server = HandlerSet()
        self.server.add_generic_rpc_handlers([*(service.generic_handler() for service in ours), *raw])
        self._interceptor = EdgeInterceptor(rt, methods)
        self._handlers: dict[str, tuple | None] = {}  # per method: (handler, is_async) or None
        self._calls: dict[int, NativeContext] = {}
        self._listeners: list[str] = []
        self._tls_followed = False
        self._started = False
        self._fold_task: concurrent.futures.Future | None = None
        self.draining_since: float | None = None  # time.monotonic() when the drain began
        self._counted = {"direct": 0, "bridged": 0}  # native.stats() folded into the metrics so far
        # the direct path takes only methods this server serves (a protocol turned off stays off)
        self.native.set_direct_methods([path for path in native.DIRECT_METHODS if path in methods])
        self.routes = DirectRoutes(rt, self.native)
        self.native.set_access_log(bool(dep.access_log and dep.access_log_sample_rate > 0))
        self.run(self._watch())

    async def _watch(self) -> None:
        self.loop.add_reader(self.native.event_fd, self._on_events)

    # --- like GrpcServer ------------------------------------------------------------------------

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def add_port(self, host: str, port: int, credentials: Any = None) -> int:
        """Listen on ``host:port`` too (0: a free port, picked now), TLS with ``credentials`` (a
        :class:`~server.tls.TlsCertificates`), else plaintext; the port. gRPC binds at
        :meth:`start` (OSError there when it cannot)."""
        if port == 0:
            port = _free_port(host)
        self._add(f"{_grpc_host(host)}:{port}", credentials, f"port {host}:{port}")
        return port

    def add_unix_socket(self, path: str, credentials: Any = None) -> None:
        self._add(f"unix:{path}", credentials, f"socket {path}")

    def _add(self, address: str, credentials: Any, what: str) -> None:
        tls = None
        if credentials is not None:
            from ..tls import TlsCertificates

            if not isinstance(credentials, TlsCertificates):
                raise TypeError(f"the native gRPC server takes server/tls.py's TlsCertificates, not "
                                f"{type(credentials).__name__}")
            tls = _tls_tuple(credentials)
            if not self._tls_followed:  # one source for every TLS listener
                self._tls_followed = True
                credentials.listeners.append(lambda material: self.native.set_tls(
                    (material.key, material.cert_chain, material.client_ca,
                     credentials.deployment.tls_require_client_cert)))
        if self.native.add_port(address, tls) < 0:
            raise OSError(f"cannot bind the gRPC {what}: gRPC refused its TLS credentials")
        self._listeners.append(what)

    def start(self) -> None:
        try:
            self.native.start()
        except RuntimeError as exc:
            raise OSError(f"cannot bind the gRPC {', '.join(self._listeners)}: {exc}") from None
        self._started = True
        self._fold_task = self.submit(self._fold_loop())
        log.info("native gRPC server (gRPC %s) on %s", self._mod.GRPC_VERSION, ", ".join(self._listeners))

    def stop(self, grace: float | None, timeout: float = 10.0) -> None:
        """Stop accepting calls, give those in progress ``grace`` seconds (None: cancel them
        now; bridged ones are cancelled on the loop), then end the loop's thread. Idempotent."""
        if not self._thread.is_alive():
            return
        try:
            if self._fold_task is not None:
                self._fold_task.cancel()
            # the direct path's calls are not in the drain gate's count: they finish first (no
            # new one takes it once draining)
            timeout_ = self.rt.deployment.drain_timeout_seconds
            if self.draining_since is not None:  # what the drain has left
                timeout_ = max(grace or 0.0, timeout_ - (time.monotonic() - self.draining_since))
            if self._started and not self.native.wait_direct_idle(timeout_):
                log.warning("calls on the native direct path still running after the drain timeout are cut off")
            done = threading.Event()

            def shutdown() -> None:
                self.native.shutdown(grace or 0.0)
                done.set()
            threading.Thread(target=shutdown, name="sp-grpc-stop", daemon=True).start()
            if not done.wait((grace or 0.0) + timeout):
                # handlers that ignored their cancellation: answered now, so gRPC can stop
                log.warning("the native gRPC server did not stop within %.1f s; ending its calls", timeout)
                self.loop.call_soon_threadsafe(self._end_all)
                done.wait(timeout)
            self.loop.call_soon_threadsafe(self._fold)  # the last answers into the metrics
            counts = self.native.stats()
            log.info("native gRPC server stopped: %d calls answered natively, %d bridged", counts["direct"],
                     counts["bridged"])
        finally:
            self.loop.call_soon_threadsafe(self.loop.remove_reader, self.native.event_fd)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    def stats(self) -> dict[str, int]:
        """Calls answered on the direct path, bridged, and the direct path's threads."""
        return self.native.stats()

    # --- the bridge -------------------------------------------------------------------------

    def _on_events(self) -> None:
        native = self._mod
        for kind, cid, call, ok in self.native.take():
            if kind == native.NEW:
                ctx = NativeContext(call, self.loop)
                self._calls[cid] = ctx
                ctx.task = self.loop.create_task(self._serve(call, ctx))
                ctx.task.add_done_callback(lambda _task, ctx=ctx: self._done(ctx))
                continue
            ctx = self._calls.get(cid)
            if ctx is None:
                continue
            if kind == native.CANCEL:
                ctx._cancel()
            else:
                ctx._wrote(ok)

    async def _resolve(self, method: str) -> tuple | None:
        async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return self.server.find(details)

        handler = await self._interceptor.intercept_service(continuation, _Details(method))
        entry = None
        if handler is not None:
            fn = handler.unary_unary or handler.unary_stream
            entry = (handler, asyncio.iscoroutinefunction(fn) if fn is not None else True)
        self._handlers[method] = entry
        return entry

    async def _serve(self, call: Any, ctx: NativeContext) -> None:
        response = None
        try:
            method = call.method
            entry = self._handlers[method] if method in self._handlers else await self._resolve(method)
            if entry is None:
                ctx._code, ctx._details = grpc.StatusCode.UNIMPLEMENTED, "Method not found!"
                return
            handler, is_async = entry
            if handler.request_streaming:
                ctx._code, ctx._details = grpc.StatusCode.UNIMPLEMENTED, _STREAMING_REQUESTS
                return
            request = call.request
            if handler.request_deserializer is not None:
                try:
                    request = handler.request_deserializer(request)
                except Exception as exc:  # as the interceptor answers ours (grpcio: UNKNOWN, outside the table)
                    ctx._code, ctx._details = grpc.StatusCode.INVALID_ARGUMENT, _not_a_message(
                        handler.request_deserializer, len(request), exc)
                    return
            if handler.unary_unary is not None:
                out = handler.unary_unary(request, ctx)
                if is_async or asyncio.iscoroutine(out):
                    out = await out
                if out is not None and ctx._code == _OK:
                    serialize = handler.response_serializer
                    response = serialize(out) if serialize is not None else out
            else:
                ctx._serializer = handler.response_serializer
                out = handler.unary_stream(request, ctx)
                if hasattr(out, "__aiter__"):
                    async for message in out:
                        await ctx.write(message)
                elif asyncio.iscoroutine(out):
                    await out
                elif out is not None:
                    for message in out:
                        await ctx.write(message)
        except _Aborted:
            pass
        except asyncio.CancelledError:
            ctx._code, ctx._details = grpc.StatusCode.CANCELLED, "Cancelled"
        except Exception as exc:  # grpcio's answer to a handler's exception
            log.exception("gRPC method %s raised", call.method)
            ctx._code, ctx._details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        finally:
            self._calls.pop(call.id, None)
            code = ctx._code
            call.finish(code.value[0], ctx._details or "", response if code == _OK else None,
                        ctx._initial, ctx._trailing)

    def _done(self, ctx: NativeContext) -> None:
        """A call's task ended: one cancelled before it began never ran :meth:`_serve` (whose
        ``finally`` finishes the call): finished here (gRPC waits for every call's finish)."""
        call = ctx.call
        if not call.finished:
            self._calls.pop(call.id, None)
            call.finish(grpc.StatusCode.CANCELLED.value[0], "Cancelled", None, None, None)

    def _end_all(self) -> None:
        for ctx in list(self._calls.values()):
            self._calls.pop(ctx.call.id, None)
            ctx.call.finish(grpc.StatusCode.UNAVAILABLE.value[0], "the server is stopping", None, None, None)

    # --- what the direct path answered --------------------------------------------------------

    async def _fold_loop(self) -> None:
        while True:
            await asyncio.sleep(FOLD_SECONDS)
            self._fold()

    def _fold(self) -> None:
        rt = self.rt
        try:
            for model, label, api, code, count, seconds, buckets in self.native.fold():
                _add(rt.metrics.request(model, label, "grpc", api, code), count, seconds, buckets)
            for model, label, api, code, message, seconds, rid in self.native.take_access():
                if code == "OK":
                    rt.access_log.ok("grpc", api, model, label, seconds, rid)
                else:
                    AccessLog.error("grpc", api, model, model, label, code, message, seconds, rid)
            counts = self.native.stats()
            for path, seen in self._counted.items():
                if counts[path] > seen:
                    rt.metrics.grpc_native_calls.labels(path).inc(counts[path] - seen)
                    self._counted[path] = counts[path]
            self.routes.refresh()
        except Exception:  # never the loop's end
            log.exception("folding the native gRPC server's counts failed")


def _not_a_message(deserializer: Any, size: int, exc: Exception) -> str:
    message = getattr(getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None), "full_name", "message")
    return f"the request is not a serialized {message} ({size} bytes): {shorten(str(exc), 120)}"


def _add(bound: Any, count: int, seconds: float, buckets: list[int]) -> None:
    """``count`` requests of ``seconds`` in all, ``buckets`` per latency bucket, into one
    :class:`~server.metrics.RequestMetrics` (prometheus_client's children, added to in bulk)."""
    bound._count.inc(count)
    if bound._error is not None:
        bound._error.inc(count)
    latency = bound._latency
    parts = getattr(latency, "_buckets", None)
    if parts is None or len(parts) != len(buckets) or not hasattr(latency, "_sum"):
        for _ in range(count):  # another client library: the mean, per request
            latency.observe(seconds / count)
        return
    latency._sum.inc(seconds)
    for part, n in zip(parts, buckets):
        if n:
            part.inc(n)


def _tls_tuple(certificates: Any) -> tuple:
    material = certificates.material
    return (material.key, material.cert_chain, material.client_ca, certificates.deployment.tls_require_client_cert)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class DirectRoutes:
    """Each model's direct path on the native server (see the module doc): a route per model
    whose plan is plain and batches on a native queue, following the DataPlane's plans; none
    when ``processor._native`` is not built or OpenTelemetry tracing is on (a sampled call needs
    its span). :meth:`refresh` follows models added since (and which model a call naming none
    runs on)."""

    def __init__(self, rt: ServingRuntime, server: Any) -> None:
        from processor import native

        self.rt = rt
        self.server = server
        self._followed: set[str] = set()
        self._front = None
        if native.MODULE is None or rt.otel is not None or not hasattr(native.MODULE, "direct_api"):
            server.set_direct_api(None)
            return
        self._front = native.MODULE.DirectFront
        server.set_direct_api(native.MODULE.direct_api)
        self.refresh()

    def refresh(self) -> None:
        if self._front is None:
            return
        names = self.rt.dataplane.model_names
        self.server.set_sole_model(names[0] if len(names) == 1 else "")
        for name in names:
            if name not in self._followed:
                self._followed.add(name)
                self.rt.dataplane.follow_plan(name, lambda plan, name=name: self._publish(name, plan))

    def _publish(self, name: str, plan: Any) -> None:
        """Under the DataPlane's publication lock: quick."""
        group = plan.group if plan is not None else None
        lane = None
        if group is not None and plan.plain and plan.batching is not None:
            lane = group.open_direct_lane()
        if lane is None:
            self.server.set_route(name, None, "", "")
            return
        front = self._front()
        front.publish(lane)
        self.server.set_route(name, front.capsule(), str(version_number(group.version)), group.version.label,
                              plan.batching.batcher.refusal("expired").message, group.signature.name,
                              bool(self.rt.model(name).config.enable_serialization_as_tensor_content))


class NativeHealth(Health):
    """The health service on the native server; :meth:`shutdown` (the drain) also turns the
    direct path off, so new calls meet the drain gate on the bridge."""

    def shutdown(self) -> None:
        self.server.draining_since = time.monotonic()
        self.server.native.set_draining(True)
        super().shutdown()


def create_native_grpc_server(rt: ServingRuntime, host: str, port: int | None, credentials: Any = None,
                              protocols: Sequence[Protocol] = ()) -> tuple[NativeGrpcServer, int | None, Health]:
    """:func:`~server.grpc.server.create_grpc_server` on the native server: ``credentials`` is a
    :class:`~server.tls.TlsCertificates` (TLS) or None."""
    server = NativeGrpcServer(rt, protocols)
    health = NativeHealth(rt, server, [name for protocol in protocols for name in protocol.grpc_health])
    return server, None if port is None else server.add_port(host, port, credentials), health
