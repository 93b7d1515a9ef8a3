"""TensorFlow's profiler on the gRPC port: ``tensorflow.ProfilerService``, as TF Serving serves it.

TF Serving serves TensorFlow's ``ProfilerService`` on its gRPC port (``--enable_profiler``, on by
default), so ``tf.profiler.experimental.client.trace('grpc://host:port', logdir, ms)`` and
TensorBoard's "Capture profile" trace a serving process. Here the same calls reach the same
implementation: TensorFlow's own profiler server (``tf.profiler.experimental.server.start``,
the C++ service TF Serving links), started in this process on the first call, and each call of
the service on our gRPC port is forwarded to it unchanged (:class:`ProfilerForward`). The
deployment key ``enable_profiler`` turns it on (false by default; ``tensorflow_model_server``
sets it from ``--enable_profiler``, true by default as in TF Serving).

Contract of a call of ``/tensorflow.ProfilerService/<method>`` (:data:`METHODS`, TensorFlow
2.21's service, every one unary):

* ``enable_profiler`` false: UNIMPLEMENTED, the message naming the key and the flag.
* No model served on TensorFlow now (ONNX Runtime models only, TensorFlow not installed, or
  none loaded yet): UNIMPLEMENTED, the message saying so; TensorFlow is not imported for it.
  The profiler traces TensorFlow's work in this process (the TraceMe events of its sessions
  and ops); an ONNX Runtime model's work is not in its traces (its per-request traces are the
  ``timeline_*`` keys).
* Else the request bytes go to TensorFlow's profiler server and its answer comes back as it
  came: the response bytes, or its status code and message (``Monitor`` is UNIMPLEMENTED there,
  as in TF Serving, which links the same service). The call's deadline travels with it, and a
  call its client cancels ends the forwarded one too; its metadata does not travel (the
  profiler reads none, and a caller's tokens stay here).

As TF Serving's, ``Profile`` makes the server write the trace itself: under the request's
``repository_root`` (the client's ``<logdir>/plugins/profile``), as
``<session>/<host>.xplane.pb``, so ``logdir`` must be a path this process can write (the same
machine, or a shared file system). Neither TF Serving nor this server authenticates the calls.

TensorFlow's server listens on a port of its own, picked at its start, on every interface
(``[::]``: its API takes a port number only), plaintext. So it starts on the first call only,
never in a process whose service is not used, and a warning is logged when that is wider than
the gRPC port (a ``host`` other than every interface, or TLS). One server per process
(TensorFlow keeps one): every :class:`ProfilerForward` of the process shares it.

The forwarded calls do not go through the server's interceptor (:mod:`server.grpc.interceptor`): they are
about the process, not a model, so they are neither counted nor access-logged as requests (each
is logged here with its caller and outcome), and their status codes are the profiler's own,
which the interceptor's one mapping (``STATUS_TABLE``) has no row for (UNIMPLEMENTED,
CANCELLED).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import grpc

from processor.errors import ProcessorError

from ..repository import off_loop
from ..runtime import ServingRuntime

log = logging.getLogger("server.grpc")

SERVICE = "tensorflow.ProfilerService"
# the methods of TensorFlow's profiler_service.proto (TF 2.21's libtensorflow_cc: all unary)
METHODS = ("Profile", "Terminate", "Monitor", "StartContinuousProfiling", "StopContinuousProfiling",
           "GetSnapshot")

_EVERY = ("0.0.0.0", "::", "[::]")  # hosts that bind every interface, as TensorFlow's server does
_lock = threading.Lock()
_port: int | None = None  # TensorFlow's profiler server of this process, once started


class ProfilerUnavailable(Exception):
    """The service cannot answer here (see the module doc): UNIMPLEMENTED with this message."""


class ProfilerForward:
    """``tensorflow.ProfilerService`` on the gRPC server of ``rt`` (see the module doc)."""

    def __init__(self, rt: ServingRuntime) -> None:
        self.rt = rt

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """Every method of :data:`METHODS`, bytes in and out (nothing parsed here)."""
        return grpc.method_handlers_generic_handler(
            SERVICE, {name: grpc.unary_unary_rpc_method_handler(self._forwarder(f"/{SERVICE}/{name}"))
                      for name in METHODS})

    def _forwarder(self, path: str):
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes | None:
            caller = context.peer() or "unknown"
            started = time.monotonic()
            try:
                self._check()
                port = await off_loop(private_port, self.rt.deployment)
            except ProfilerUnavailable as exc:
                log.info("%s by %s: UNIMPLEMENTED: %s", path, caller, exc, extra={"client": caller})
                context.set_code(grpc.StatusCode.UNIMPLEMENTED)
                context.set_details(str(exc))
                return None
            # one channel per call: calls are rare and last seconds, and nothing outlives them
            async with grpc.aio.insecure_channel(f"localhost:{port}", options=_CHANNEL_OPTIONS) as channel:
                try:
                    response = await channel.unary_unary(path)(request, timeout=context.time_remaining())
                except grpc.aio.AioRpcError as exc:
                    log.info("%s by %s: %s in %.1f s: %s", path, caller, exc.code().name,
                             time.monotonic() - started, exc.details(), extra={"client": caller})
                    context.set_code(exc.code())
                    context.set_details(exc.details() or "")
                    return None
            log.info("%s by %s: OK in %.1f s", path, caller, time.monotonic() - started, extra={"client": caller})
            return response
        return forward

    def _check(self) -> None:
        """ProfilerUnavailable unless the service is on and a model serves on TensorFlow now."""
        if not self.rt.deployment.enable_profiler:
            raise ProfilerUnavailable(f"{SERVICE} is off on this server (the deployment key enable_profiler is "
                                      f"false; tensorflow_model_server: --enable_profiler=false)")
        if not any(_on_tensorflow(self.rt, name) for name in self.rt.dataplane.model_names):
            raise ProfilerUnavailable(f"{SERVICE} traces TensorFlow models, and no model serves on TensorFlow "
                                      f"here now (ONNX Runtime models' traces are the timeline_* keys of their "
                                      f"model_config)")


# TensorFlow's client sets no size limit either (CreateStub: the largest int)
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def _on_tensorflow(rt: ServingRuntime, name: str) -> bool:
    """Model ``name`` serves a version on the TensorFlow backend now."""
    try:
        return rt.dataplane.served(name).engine_name == "tensorflow"
    except ProcessorError:  # not loaded (yet), or gone meanwhile
        return False


def private_port(deployment: Any) -> int:
    """The port of TensorFlow's profiler server of this process, started on the first call
    (blocking: call it off the event loop; only once a model serves on TensorFlow, so TensorFlow
    is imported already); ProfilerUnavailable when it did not start."""
    global _port
    with _lock:
        if _port is None:
            _port = _start(deployment)
        return _port


def _start(deployment: Any) -> int:
    import tensorflow as tf

    # The port is held, not listening, while TensorFlow binds it: another process cannot take it
    # in between (TensorFlow's gRPC server binds with SO_REUSEPORT too, so it shares the hold;
    # only listening sockets get connections).
    hold = _hold_port()
    try:
        port = hold.getsockname()[1]
        tf.profiler.experimental.server.start(port)
    finally:
        hold.close()
    try:  # TensorFlow logs a failed bind and returns: a connection tells
        socket.create_connection(("localhost", port), timeout=5).close()
    except OSError as exc:
        raise ProfilerUnavailable(f"TensorFlow's profiler server did not start on port {port}: {exc}") from None
    wider = [why for why, on in ((f"the server binds {deployment.host} only", deployment.host not in _EVERY),
                                 ("the gRPC port speaks TLS", deployment.grpc_tls_on)) if on]
    log.log(logging.WARNING if wider else logging.INFO,
            "%s: TensorFlow's profiler server started on [::]:%d (every interface, plaintext; the gRPC port "
            "forwards to it)%s", SERVICE, port,
            f"; wider than the gRPC port: {', '.join(wider)} (enable_profiler false keeps it closed)"
            if wider else "")
    return port


def _hold_port() -> socket.socket:
    """A socket bound to a free port on every interface with SO_REUSEPORT, not listening."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here: TensorFlow's server falls back to IPv4 too
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, 0))
            return sock
        except OSError:
            sock.close()
    raise ProfilerUnavailable("no port to start TensorFlow's profiler server on")
