"""The gRPC front-end (grpcio): thin transport over :class:`~server.runtime.ServingRuntime`.

Services:

* ``tensorflow.eas.ProcessorService/Predict`` (``protos/processor_service.proto``): our
  ``PredictRequest`` / ``PredictResponse``; the model is named by the ``model-name`` request
  metadata (optional when one model is served). Bytes go straight to ``DataPlane.predict``. An
  empty request message is DeepRec's introspection ping, as an empty HTTP body and the C ABI's
  empty ``process()`` are: the answer is the signature as JSON bytes (not a ``PredictResponse``;
  read it with a raw-bytes call, e.g. ``channel.unary_unary(path)``), with the trailing
  metadata ``x-response-format: signature-json``.
* ``tensorflow.serving.PredictionService`` (Predict, Classify, Regress, MultiInference,
  GetModelMetadata) and ``tensorflow.serving.ModelService/GetModelStatus``: the messages of the
  ``tensorflow-serving-api`` package, so unchanged TF Serving clients work (:mod:`.tfs`).
* ``grpc.health.v1.Health``: ``""`` is SERVING when every model is ready; each service name when
  at least one model is; each model name when that model is; all NOT_SERVING while draining.

Errors: a ProcessorError aborts the call with the gRPC status of ``STATUS_TABLE``. Messages over
``max_request_bytes`` are refused by gRPC itself with RESOURCE_EXHAUSTED. Request ids travel in
the ``x-request-id`` metadata (returned in the trailing metadata).

Limits (deployment keys): request metadata over ``max_header_bytes`` is refused by gRPC,
connections beyond ``max_connections`` are not accepted, ``grpc_max_concurrent_streams`` streams
per connection, and beyond ``grpc_max_concurrent_rpcs`` calls in progress or queued a call gets
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from processor.errors import InvalidArgument, edge_error
from processor.request import PredictCall

from ..deadline import from_grpc
from ..logs import new_request_id, request_id_var
from ..runtime import ServingRuntime
from . import tfs, v2

log = logging.getLogger("server.grpc")

PROCESSOR_SERVICE = "tensorflow.eas.ProcessorService"
MODEL_NAME_KEYS = ("model-name", "x-model-name")
MAX_MESSAGE = 4096  # characters of an error message sent (a client's metadata limit is 8-16 KiB)


def abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    """The one mapping of an error to gRPC: STATUS_TABLE's status name and the message."""
    err = edge_error(exc, "grpc", log)
    message = err.message  # it travels in the trailing metadata: never past a client's limit
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message)} characters)"
    context.abort(grpc.StatusCode[err.edge.grpc], message)


def _metadata(context: grpc.ServicerContext, keys: tuple[str, ...]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key in keys:
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class _Handlers:
    """The unary handlers; each resolves the model, then runs inside ``rt.track``."""

    def __init__(self, rt: ServingRuntime) -> None:
        self.rt = rt

    def _call(self, api: str, model: str, context: grpc.ServicerContext,
              work: Callable[[], Any], request_id: str | None = None) -> Any:
        """``work()`` as one ``api`` request to ``model``: its request id (``request_id``, else the
        ``x-request-id`` metadata, else a new one) echoed in the trailing metadata, tracked
        (``rt.track``), any error aborting the call through the one mapping."""
        rid = new_request_id(request_id or _metadata(context, ("x-request-id",)))
        token = request_id_var.set(rid)
        context.set_trailing_metadata((("x-request-id", rid),))
        try:
            try:
                with self.rt.track(model, "grpc", api):
                    return work()
            except Exception as exc:
                abort(context, exc)
        finally:
            request_id_var.reset(token)

    # --- ours ------------------------------------------------------------------------------

    def eas_predict(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        model, rid = "", None  # one pass over the metadata for both
        for key, value in context.invocation_metadata() or ():
            if key in MODEL_NAME_KEYS and not model:
                model = value if isinstance(value, str) else value.decode("latin-1")
            elif key == "x-request-id" and rid is None:
                rid = value if isinstance(value, str) else value.decode("latin-1")
        names = self.rt.dataplane.model_names
        if not model and len(names) == 1:
            model = names[0]

        def work() -> bytes:
            if not model:
                raise InvalidArgument(f"name the model in the 'model-name' request metadata; "
                                      f"serving {sorted(names)}")
            result = self.rt.dataplane.predict(PredictCall(model, data, deadline=from_grpc(context)))
            if result.introspection:  # the signature JSON, as HTTP and the C ABI answer
                context.set_trailing_metadata((("x-request-id", request_id_var.get()),
                                               ("x-response-format", "signature-json")))
            return result.outputs
        return self._call("predict", model, context, work, rid)


def _generic_handlers(rt: ServingRuntime) -> list[grpc.GenericRpcHandler]:
    h = _Handlers(rt)
    handlers = [grpc.method_handlers_generic_handler(PROCESSOR_SERVICE, {
        # no (de)serializer: grpcio hands the bytes over as they are, with no Python call
        "Predict": grpc.unary_unary_rpc_method_handler(h.eas_predict),
    })]
    handlers.append(v2.generic_handler(h))  # the Open Inference Protocol (KServe v2)
    handlers.extend(tfs.generic_handlers(h))  # TF Serving's PredictionService and ModelService
    return handlers


class Health:
    """Keeps the standard health service in step with the models (polls every ``interval``)."""

    def __init__(self, rt: ServingRuntime, server: grpc.Server, interval: float = 0.5) -> None:
        self.rt = rt
        self.servicer = None
        self._stop = threading.Event()
        self._interval = interval
        try:
            from grpc_health.v1 import health, health_pb2_grpc
        except ImportError as exc:
            log.warning("gRPC health service disabled: %s (pip install grpcio-health-checking)", exc)
            return
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        self.update()
        rt.on_model_ready.append(lambda name: self.update())
        threading.Thread(target=self._loop, name="sp-grpc-health", daemon=True).start()

    def update(self) -> None:
        if self.servicer is None:
            return
        from grpc_health.v1 import health_pb2

        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        ready = self.rt.readiness()
        self.servicer.set("", serving if ready and all(ready.values()) else not_serving)
        any_ready = serving if any(ready.values()) else not_serving
        for service in (PROCESSOR_SERVICE, tfs.PREDICTION_SERVICE, tfs.MODEL_SERVICE, v2.SERVICE):
            self.servicer.set(service, any_ready)
        for name, ok in ready.items():
            self.servicer.set(name, serving if ok else not_serving)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.update()

    def shutdown(self) -> None:
        self._stop.set()
        if self.servicer is not None:
            self.servicer.enter_graceful_shutdown()


def create_grpc_server(rt: ServingRuntime, host: str, port: int,
                       credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, int, Health]:
    """A started-later grpc.Server bound to ``host:port`` (0: a free port); returns the port.
    With ``credentials`` (server/tls.py) the port speaks TLS."""
    dep = rt.deployment
    workers = dep.grpc_max_workers or max(4, sum(e.threads for e in dep.models) + 2)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sp-grpc"),
        handlers=_generic_handlers(rt),
        options=grpc_options(dep),
        maximum_concurrent_rpcs=dep.grpc_max_concurrent_rpcs,
    )
    health = Health(rt, server)
    return server, add_grpc_port(server, host, port, credentials), health


def add_grpc_port(server: grpc.Server, host: str, port: int,
                  credentials: grpc.ServerCredentials | None = None) -> int:
    """Bind one more port (TLS with ``credentials``, else plaintext); returns the bound port."""
    address = f"{_grpc_host(host)}:{port}"
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"cannot bind the gRPC port {host}:{port}")
    return bound


def grpc_options(dep) -> list[tuple[str, int]]:
    """The server's channel arguments: message size, metadata size and connection limits."""
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
