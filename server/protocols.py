"""How a protocol plugs into the server: one :class:`Protocol` registration per protocol package.

The server speaks three protocols, each a package holding its REST routes, its gRPC services
and its codecs: our own (:mod:`server.eas`: ``tensorflow.eas.ProcessorService`` and
``/api/predict/...``), TensorFlow Serving's (:mod:`server.tfserving.status`) and KServe v2's, the Open
Inference Protocol (:mod:`server.kserve`). Each package exposes a ``PROTOCOL``; the composition
root lists them once (:data:`server.app.PROTOCOLS`) and hands that list to the transports:
:func:`server.http.app.create_http_app` adds each protocol's HTTP routes, and
:func:`server.grpc.server.create_grpc_server` its gRPC services. The transports
(:mod:`server.http`, :mod:`server.grpc`) import no protocol package.

Registration happens once, at start-up: a protocol's inference routes join the HTTP fast path
(:class:`~server.http.predict.PredictRoutes`: one ordered list of patterns, matched per request
exactly as before) and its gRPC services the server's handlers; nothing is looked up per request.

A registration's callables import their protocol's modules when called, so importing a
protocol package (``tensorflow_model_server`` imports :mod:`server.tfserving.status`) costs nothing.
This module imports nothing of the server (it is below every package that uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Protocol:
    """One protocol's parts, as the transports take them.

    * ``http(app, rt, predict)``: adds the protocol's FastAPI routes to ``app`` (what OpenAPI
      documents) and its inference routes to ``predict`` (the
      :class:`~server.http.predict.PredictRoutes` fast path, :meth:`~server.http.predict.PredictRoutes.add`);
      None: no HTTP part.
    * ``grpc(rt, admin)``: the protocol's gRPC services (:class:`~server.grpc.interceptor.Service`),
      served under the server's interceptor; ``admin``: the server's
      :class:`~server.grpc.server.GrpcAdminGate` for admin methods; None: no gRPC part.
    * ``grpc_raw(rt)``: gRPC handlers served outside the interceptor (``grpc.GenericRpcHandler``:
      TensorFlow's profiler service, forwarded byte for byte).
    * ``grpc_health``: the service names the standard health service reports (SERVING while
      at least one model is ready).
    * ``http_case_folded``: path prefixes the protocol matches case-insensitively (TF Serving's
      ``/v1/models``): the HTTP app folds them to this spelling before routing.
    """

    name: str
    http: Callable[[Any, Any, Any], None] | None = None
    grpc: Callable[[Any, Any], list] | None = None
    grpc_raw: Callable[[Any], list] | None = None
    grpc_health: tuple[str, ...] = ()
    http_case_folded: tuple[str, ...] = ()
