"""The HTTP front-end (FastAPI): thin transport over :class:`~server.runtime.ServingRuntime`.

Endpoints (OpenAPI at ``/docs`` and ``/openapi.json``):

* ``POST /api/predict/{model}``: our wire format, a serialized ``tensorflow.eas.PredictRequest``
  in, ``PredictResponse`` bytes out (DeepRec / EAS); an empty body returns the signature JSON,
  as ``process()`` does; ``/api/predict/{model}/versions/{n}`` and ``.../labels/{l}``: on that
  version. ``GET /api/models``, ``GET /api/models/{model}``: model info.
* Every inference answer (our wire format, TF Serving REST, KServe v2) names the version that
  answered in ``X-Model-Version``; ``X-Routing-Key`` picks the arm of a model's traffic split.
* TensorFlow Serving REST: ``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict``
  (row and columnar JSON, b64), ``:classify`` and ``:regress`` (``examples``, ``context``),
  ``GET /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata]`` (status, metadata: every
  signature); case-insensitive paths, as TF Serving's regexes.
* Probes: ``/healthz`` and ``/v2/health/live`` (liveness), ``/readyz`` and ``/v2/health/ready``
  (every model loaded and warm, not draining), ``/v2/models/{name}/ready``.
* Prometheus: ``/metrics`` and ``/monitoring/prometheus/metrics``.
* Admin: ``POST /admin/models/{model}/reload``, ``POST /admin/models/{model}/rollback``,
  ``PUT|DELETE /admin/models/{model}/pin``, ``GET|PUT /admin/models/{model}/routing`` (labels,
  traffic split, shadow). They need the admin token (``Authorization: Bearer``
  or ``X-Admin-Token``, compared in constant time); with no token configured they answer 403,
  unless ``admin_allow_without_token`` is set on a loopback-only host. With ``admin_client_cert``
  an HTTPS client whose certificate the client CA verified is let in without the token
  (``admin_client_cert_names`` narrows it to named certificates). Every admin call is logged
  with the caller's address.
* Model repository (KServe v2's extension, admin-protected as above): ``POST
  /v2/repository/index``, ``POST /v2/repository/models/{m}/load`` and ``/unload``.

Every error is ``{"error": "<message>"}`` with the HTTP status of ``STATUS_TABLE`` (OpenAPI lists
them per route); a 405 carries ``Allow``. Model work runs on the model's thread pool, never on the
event loop. Header size and count, read timeouts and the connection cap are enforced below the
application, by the connection protocol (:mod:`server.http.protocol`).
"""
# (this docstring is the OpenAPI document's description; the code: each protocol's routes come
# from its package, server/eas, server/tfserving, server/kserve, registered through
# server/protocols.py; this module adds them and the routes every protocol shares)

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI

from ..logs import new_request_id, request_id_var
from ..otel import edge_trace
from ..protocols import Protocol
from ..runtime import ServingRuntime
from . import admin, errors, probe_routes
from .predict import PredictRoutes


def create_http_app(rt: ServingRuntime, protocols: Sequence[Protocol]) -> Any:
    """The ASGI application (FastAPI wrapped in the request-id / path middleware), composed of
    each protocol's routes (``protocols``, in order: their registrations, server/protocols.py;
    each adds its FastAPI routes and its inference routes to the fast path), the routes every
    protocol shares (:mod:`.probe_routes`, :mod:`.admin`), the error answers and their OpenAPI
    description (:mod:`.errors`) and the inference fast path (:mod:`.predict`). FastAPI matches
    routes in the order they are added: a protocol's catch-all (TF Serving's ``/v1/{path}``)
    comes after its own routes."""
    dep = rt.deployment
    app = FastAPI(
        title="serving-processor",
        version="0.1.0",
        description=__doc__,
        docs_url="/docs" if dep.enable_docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if dep.enable_docs else None,
    )
    predict = PredictRoutes(rt)
    errors.install(app, predict)
    for protocol in protocols:
        if protocol.http is not None:
            protocol.http(app, rt, predict)
    probe_routes.register(app, rt)
    probe_routes.register_metrics(app, rt)
    admin.register(app, rt)
    folded = tuple(prefix for protocol in protocols for prefix in protocol.http_case_folded)
    return RequestContext(app, predict, folded)


class RequestContext:
    """ASGI middleware: request id (``X-Request-ID`` in and out), the protocols' case-insensitive
    path prefixes (``folded``: TF Serving's ``/v1/models``) in the spelling their routes match,
    and the inference fast path (POSTs to inference URLs go straight to :class:`PredictRoutes`);
    with tracing on, the request's W3C trace context (server/otel.py: ``traceparent`` in, and out
    when the request was traced)."""

    def __init__(self, app: FastAPI, predict: PredictRoutes, folded: tuple[str, ...] = ()) -> None:
        self.app = app
        self.predict = predict
        # (prefix, its length, a pattern matching it in any case), made once
        self._folds = tuple((prefix, len(prefix), re.compile("^" + re.escape(prefix), re.I)) for prefix in folded)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        for prefix, n, any_case in self._folds:
            if path[:n] != prefix and any_case.match(path):
                path = prefix + path[n:]
                scope = dict(scope, path=path)
                break
        given = None
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                given = value.decode("latin-1")
                break
        rid = new_request_id(given)
        token = request_id_var.set(rid)
        header = (b"x-request-id", rid.encode())
        otel = self.predict.rt.otel
        edge = otel.http_edge(scope["headers"], scope["method"]) if otel is not None else None
        if edge is not None:  # the sampler picked it
            edge_token = edge_trace.set(edge)
        try:
            handler = self.predict.route(path) if scope["method"] == "POST" else None
            if handler is not None:
                reply = await handler(receive, scope["headers"])
                headers = [(b"content-type", reply.content_type.encode()),
                           (b"content-length", str(len(reply.body)).encode()), header, *reply.headers]
                if edge is not None and edge.span is not None:
                    headers.append((b"traceparent", edge.response_traceparent().encode()))
                await send({"type": "http.response.start", "status": reply.status, "headers": headers})
                await send({"type": "http.response.body", "body": reply.body})
                return

            async def send_with_id(message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), header]
                    if edge is not None and edge.span is not None:
                        message["headers"].append((b"traceparent", edge.response_traceparent().encode()))
                await send(message)

            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)
            if edge is not None:
                edge_trace.reset(edge_token)
