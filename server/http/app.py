"""The HTTP front-end (FastAPI): thin transport over :class:`~server.runtime.ServingRuntime`.

Endpoints (OpenAPI at ``/docs`` and ``/openapi.json``):

* ``POST /api/predict/{model}``: our wire format, a serialized ``tensorflow.eas.PredictRequest``
  in, ``PredictResponse`` bytes out (DeepRec / EAS); an empty body returns the signature JSON,
  as ``process()`` does. ``GET /api/models``, ``GET /api/models/{model}``: model info.
* TensorFlow Serving REST: ``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict``
  (row and columnar JSON, b64), ``:classify`` and ``:regress`` (``examples``, ``context``),
  ``GET /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata]`` (status, metadata: every
  signature); case-insensitive paths, as TF Serving's regexes.
* Probes: ``/healthz`` and ``/v2/health/live`` (liveness), ``/readyz`` and ``/v2/health/ready``
  (every model loaded and warm, not draining), ``/v2/models/{name}/ready``.
* Prometheus: ``/metrics`` and ``/monitoring/prometheus/metrics``.
* Admin: ``POST /admin/models/{model}/reload``, ``POST /admin/models/{model}/rollback``,
  ``PUT|DELETE /admin/models/{model}/pin``. They need the admin token (``Authorization: Bearer``
  or ``X-Admin-Token``, compared in constant time); with no token configured they answer 403,
  unless ``admin_allow_without_token`` is set on a loopback-only host. With ``admin_client_cert``
  an HTTPS client whose certificate the client CA verified is let in without the token
  (``admin_client_cert_names`` narrows it to named certificates). Every admin call is logged
  with the caller's address.

Every error is ``{"error": "<message>"}`` with the HTTP status of ``STATUS_TABLE`` (OpenAPI lists
them per route); a 405 carries ``Allow``. Model work runs on the model's thread pool, never on the
event loop. Header size and count, read timeouts and the connection cap are enforced below the
application, by the connection protocol (:mod:`server.http.protocol`).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from processor.errors import InvalidArgument, ProcessorError
from processor.request import parse_version

from .. import tfserving
from ..logs import new_request_id, request_id_var
from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..runtime import ServingRuntime
from . import v2
from .predict import EAS_PREFIX, PREDICT_PATH, PROTOBUF, PredictRoutes, as_response, error_reply, tracked

log = logging.getLogger("server.http")

_STATUS_PATH = re.compile(  # ASCII digits (\d takes "²"); parse_version refuses over int64
    r"^/v1/models(?:/([^/:]+))?(?:/versions/([0-9]+)|/labels/([^/:]+))?(?:/(metadata))?$", re.I)
_V1_PREFIX = re.compile(r"^/v1/models", re.I)


def error_response(exc: BaseException) -> Response:
    """An error as ``{"error": message}`` with STATUS_TABLE's HTTP status (see predict.error_reply)."""
    return as_response(error_reply(exc))


class ErrorBody(BaseModel):
    """Every error response."""

    error: str = Field(description="what went wrong, naming the key, input or limit")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses a route can answer."""
    return {code: {"model": ErrorBody, "description": ERROR_MEANINGS[code]} for code in codes}


ERROR_MEANINGS = {
    400: "bad request: malformed body, wrong dtype or shape, missing input, bad parameter",
    401: "admin token required",
    403: "admin token rejected, or admin endpoints disabled (no token configured)",
    404: "unknown model, version or signature",
    405: "method not allowed (see the Allow header)",
    408: "request headers or body not received in time",
    413: "request body over max_request_bytes",
    431: "request header fields over max_header_bytes / max_header_count",
    500: "internal failure",
    503: "model not ready, server draining, feature store down, or too many connections",
    504: "the request's deadline passed",
}
PREDICT_ERRORS = _errors(400, 404, 408, 413, 431, 500, 503, 504)
INFO_ERRORS = _errors(404, 503)
ADMIN_ERRORS = _errors(400, 401, 403, 404, 500, 503)


class PinBody(BaseModel):
    version: int = Field(ge=0, description="the step to serve: a full checkpoint step, or a delta step "
                                           "(its full plus that delta)")


class RollbackBody(BaseModel):
    version: int | None = Field(None, ge=0, description="version to serve; omitted: the previous one")


def create_http_app(rt: ServingRuntime) -> Any:
    """The ASGI application (FastAPI wrapped in the request-id / path middleware)."""
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

    async def serve(model: str, api: str, work: Callable[[], Awaitable[Response]]) -> Response:
        return await tracked(rt, model, api, work, error_response)

    # --- errors raised outside handlers (routing, validation) --------------------------------

    @app.exception_handler(ProcessorError)
    async def _processor_error(_: Request, exc: ProcessorError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return error_response(InvalidArgument(f"bad request: {problems}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            allowed = _allowed_methods(app, request.scope)
            headers["Allow"] = ", ".join(allowed)
            message = f"method {request.method} not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        else:
            message = str(exc.detail)
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=headers or None)

    # --- our wire format ---------------------------------------------------------------------

    @app.post("/api/predict/{model}", tags=["processor"], summary="Predict (tensorflow.eas wire format)",
              openapi_extra={"requestBody": {"content": {PROTOBUF: {"schema": {
                  "type": "string", "format": "binary"}}}, "description":
                  "serialized tensorflow.eas.PredictRequest; empty: returns the signature as JSON"}},
              responses={200: {"content": {PROTOBUF: {}}, "description": "serialized PredictResponse"},
                         **PREDICT_ERRORS})
    async def eas_predict(model: str, request: Request) -> Response:
        # RequestContext answers these requests itself (PredictRoutes); this route documents them
        return as_response(await predict.eas(model, request.receive, request.scope["headers"]))

    @app.get("/api/models", tags=["processor"], summary="Served models and their states")
    async def list_models() -> dict:
        return {"models": [{"name": m.name, "state": m.state, "ready": m.ready,
                            "version": rt.version_label(m.name)} for m in rt.models]}

    @app.get("/api/models/{model}", tags=["processor"], summary="Model info", responses=INFO_ERRORS)
    async def model_info(model: str) -> Response:
        async def work() -> Response:
            return JSONResponse(model_details(rt, model))
        return await serve(model, "model_info", work)

    # --- TensorFlow Serving REST -------------------------------------------------------------

    @app.get("/v1/models", tags=["tensorflow-serving"], include_in_schema=False)
    async def tfs_no_model() -> Response:
        return error_response(InvalidArgument("Missing model name in request."))

    @app.post("/v1/models/{path:path}", tags=["tensorflow-serving"],
              summary="TF Serving predict: /v1/models/{name}[/versions/{v}|/labels/{l}]:predict",
              openapi_extra={"requestBody": {"content": {"application/json": {
                  "schema": {"type": "object", "properties": {
                      "signature_name": {"type": "string"},
                      "instances": {"description": "row format: a list, one element per example"},
                      "inputs": {"description": "columnar format: a tensor or {input: tensor}"}}},
                  "example": {"instances": [{"x": [1.0]}]}}}}},
              responses=PREDICT_ERRORS)
    async def tfs_post(path: str, request: Request) -> Response:
        # RequestContext answers predict URLs itself (PredictRoutes); others end here
        return as_response(await predict.tfs(request.url.path, request.receive, request.scope["headers"]))

    @app.get("/v1/models/{path:path}", tags=["tensorflow-serving"],
             summary="TF Serving status / metadata: /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata]",
             responses=_errors(400, 404, 503))
    async def tfs_get(path: str, request: Request) -> Response:
        m = _STATUS_PATH.match(request.url.path)
        if m is None or not m.group(1):
            if m is not None:
                return error_response(InvalidArgument("Missing model name in request."))
            return error_response(InvalidArgument(f"Malformed request: GET {request.url.path}"))
        name, version, label, metadata = m.group(1), m.group(2), m.group(3), m.group(4)

        async def work() -> Response:
            wanted = None if version is None else parse_version(version)
            if metadata:
                return JSONResponse(tfs_metadata(rt, name, wanted, label))
            return JSONResponse(tfs_status(rt, name, wanted, label))
        return await serve(name, "tfs_metadata" if metadata else "tfs_status", work)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"], include_in_schema=False)
    async def tfs_malformed(path: str, request: Request) -> Response:
        # any other /v1 path: TF Serving's handler owns /v1/.* and answers it so
        return error_response(InvalidArgument(f"Malformed request: {request.method} {request.url.path}"))

    # --- probes and metrics ------------------------------------------------------------------

    @app.get("/healthz", tags=["health"], summary="Liveness")
    @app.get("/v2/health/live", tags=["health"], summary="Liveness (KServe v2 path)")
    async def live() -> dict:
        return {"live": True}

    @app.get("/readyz", tags=["health"], summary="Readiness: every model loaded and warm",
             responses={503: {"description": "a model not ready, or the server draining"}})
    @app.get("/v2/health/ready", tags=["health"], summary="Readiness (KServe v2 path)")
    async def ready() -> JSONResponse:
        states, readiness = rt.states(), rt.readiness()
        body: dict[str, Any] = {"ready": rt.ready, "draining": rt.gate.draining, "models": states}
        if not body["ready"]:
            waiting = [f"{n}: {s}" for n, s in states.items() if not readiness[n]]
            body["error"] = ("server is shutting down" if rt.gate.draining
                             else f"models not ready: {', '.join(waiting)}")
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    @app.get("/v2/models/{model}/ready", tags=["health"], summary="One model's readiness",
             responses=INFO_ERRORS)
    async def model_ready(model: str) -> JSONResponse:
        try:
            served, ok = rt.model(model), rt.model_ready(model)
        except ProcessorError as exc:
            return error_response(exc)
        body = {"name": model, "ready": ok, "state": served.state}
        if not ok:
            body["error"] = served.last_error or f"model {model!r} is {served.state}"
        return JSONResponse(body, status_code=200 if ok else 503)

    v2.register(app, rt, PREDICT_ERRORS, predict)  # the Open Inference Protocol (KServe v2)

    @app.get("/metrics", tags=["metrics"], summary="Prometheus metrics")
    @app.get("/monitoring/prometheus/metrics", tags=["metrics"], summary="Prometheus metrics (TF Serving path)")
    async def metrics() -> Response:
        return Response(rt.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def index() -> dict:
        return {"service": "serving-processor", "models": rt.models.names,
                "docs": "/docs" if dep.enable_docs else None}

    # --- admin -------------------------------------------------------------------------------

    gate = AdminGate(rt.admin_token, dep.admin_allow_without_token,
                     tuple(dep.admin_client_cert_names) if dep.admin_client_cert else None)

    async def admin(request: Request, model: str, action: str, fn: Callable[[str], dict]) -> Response:
        caller = _caller(request)
        tls = request.scope.get("extensions", {}).get("tls", {})  # server/http/protocol.py
        denied = gate.check(request.headers.get("authorization", ""), request.headers.get("x-admin-token", ""),
                            tls.get("client_cert_names"))
        if denied is not None:
            status, message = denied
            log.warning("admin %s of %s by %s refused (%d): %s", action, model, caller, status, message,
                        extra={"client": caller, "model": model})
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            return JSONResponse({"error": message}, status_code=status, headers=headers)
        log.info("admin %s of %s requested by %s", action, model, caller, extra={"client": caller, "model": model})
        try:
            rt.model(model)  # NotFound for an unknown model
            ctx = contextvars.copy_context()
            result = await asyncio.get_running_loop().run_in_executor(None, ctx.run, fn, caller)
        except Exception as exc:
            return error_response(exc)
        return JSONResponse(result)

    @app.post("/admin/models/{model}/reload", tags=["admin"], responses=ADMIN_ERRORS,
              summary="Load the version the model store names now")
    async def admin_reload(model: str, request: Request) -> Response:
        return await admin(request, model, "reload", lambda caller: rt.reload(model, caller=caller))

    @app.post("/admin/models/{model}/rollback", tags=["admin"], responses=ADMIN_ERRORS,
              summary="Serve a given version, or the previous one")
    async def admin_rollback(model: str, request: Request, body: RollbackBody | None = None) -> Response:
        version = body.version if body else None
        return await admin(request, model, "rollback", lambda caller: rt.rollback(model, version, caller=caller))

    @app.put("/admin/models/{model}/pin", tags=["admin"], responses=ADMIN_ERRORS,
             summary="Pin a version (no automatic updates)")
    async def admin_pin(model: str, body: PinBody, request: Request) -> Response:
        return await admin(request, model, "pin", lambda caller: rt.pin(model, body.version, caller=caller))

    @app.delete("/admin/models/{model}/pin", tags=["admin"], responses=ADMIN_ERRORS,
                summary="Unpin: follow the newest version again")
    async def admin_unpin(model: str, request: Request) -> Response:
        return await admin(request, model, "unpin", lambda caller: rt.unpin(model, caller=caller))

    app.openapi = lambda: _openapi(app)
    return RequestContext(app, predict)


# --- admin access, 405 Allow, OpenAPI ---------------------------------------------------------

class AdminGate:
    """Who may call the admin endpoints.

    With a token: a request must carry it (``Authorization: Bearer <token>`` or
    ``X-Admin-Token``); missing is 401, wrong is 403. Both sides are hashed before the
    constant-time comparison, so neither the content nor the length of the token leaks through
    timing. Without a token: 403 for everyone, unless ``allow_without_token`` (which the
    deployment allows only on a loopback host).

    ``cert_names`` (``admin_client_cert``): a request over a connection with a verified client
    certificate is allowed without the token when the certificate names one of them (an empty
    tuple: any certificate the client CA signed); None: certificates do not count.
    """

    def __init__(self, token: str | None, allow_without_token: bool = False,
                 cert_names: tuple[str, ...] | None = None) -> None:
        self._digest = hashlib.sha256(token.encode()).digest() if token else None
        self.allow_without_token = allow_without_token
        self.cert_names = cert_names

    def check(self, authorization: str, x_admin_token: str = "",
              client_cert_names: tuple[str, ...] | None = None) -> tuple[int, str] | None:
        """None when allowed, else (HTTP status, message)."""
        if self.cert_names is not None and client_cert_names is not None:
            if not self.cert_names or set(client_cert_names) & set(self.cert_names):
                return None
        if self._digest is None:
            if self.allow_without_token:
                return None
            if self.cert_names is not None:
                return 403, ("admin endpoints need a client certificate "
                             + ("naming one of admin_client_cert_names" if self.cert_names else
                                "signed by tls_client_ca_file") + " (admin_client_cert)")
            return 403, ("admin endpoints are disabled: no admin token is configured (set admin_token_env "
                         "in the deployment config, or admin_allow_without_token on a loopback-only host)")
        given = x_admin_token or ""
        if authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        if not given:
            return 401, "admin token required: send 'Authorization: Bearer <token>'"
        if not hmac.compare_digest(hashlib.sha256(given.encode("utf-8", "surrogateescape")).digest(),
                                   self._digest):
            return 403, "admin token rejected"
        return None


def _caller(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else "unknown"


def _allowed_methods(app: FastAPI, scope: dict) -> list[str]:
    """Every method some route takes at this path (for ``Allow``)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    if scope.get("path", "").startswith(EAS_PREFIX) or PREDICT_PATH.match(scope.get("path", "")):
        methods.add("POST")  # answered by RequestContext before routing
    return sorted(methods)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with our validation errors: 400 ``{"error"}``, never 422."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    error_ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for item in doc.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None and "400" not in responses:
                responses["400"] = {"description": ERROR_MEANINGS[400], **error_ref}
    schemas = doc.get("components", {}).get("schemas", {})
    used = str(doc.get("paths"))
    for name in ("HTTPValidationError", "ValidationError"):
        if f"/{name}'" not in used and name in schemas:
            del schemas[name]
    app.openapi_schema = doc
    return doc


# --- TF Serving handlers (run on the model's thread pool) -------------------------------------

def tfs_status(rt: ServingRuntime, name: str, version: int | None, label: str | None) -> dict:
    statuses = tfserving.served_model_status(rt.model(name), version, label)
    return {"model_version_status": [s.as_json() for s in statuses]}


def tfs_metadata(rt: ServingRuntime, name: str, version: int | None, label: str | None) -> dict:
    served = rt.dataplane.served(name, version, label)
    return {"model_spec": {"name": name, "signature_name": "", "version": str(served.version_number)},
            "metadata": tfserving.signature_def_json(served.signatures.values())}


def model_details(rt: ServingRuntime, name: str) -> dict:
    """Model info: state, served version, signature, session group, validated config."""
    return rt.model(name).info()


class RequestContext:
    """ASGI middleware: request id (``X-Request-ID`` in and out), case-insensitive ``/v1/models``,
    and the predict hot path (POSTs to predict URLs go straight to :class:`PredictRoutes`)."""

    def __init__(self, app: FastAPI, predict: PredictRoutes) -> None:
        self.app = app
        self.predict = predict

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path[:10] != "/v1/models" and _V1_PREFIX.match(path):
            path = "/v1/models" + path[10:]
            scope = dict(scope, path=path)
        given = None
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                given = value.decode("latin-1")
                break
        rid = new_request_id(given)
        token = request_id_var.set(rid)
        header = (b"x-request-id", rid.encode())
        try:
            handler = self.predict.route(path) if scope["method"] == "POST" else None
            if handler is not None:
                reply = await handler(receive, scope["headers"])
                await send({"type": "http.response.start", "status": reply.status, "headers": [
                    (b"content-type", reply.content_type.encode()),
                    (b"content-length", str(len(reply.body)).encode()), header, *reply.headers]})
                await send({"type": "http.response.body", "body": reply.body})
                return

            async def send_with_id(message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), header]
                await send(message)

            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)
