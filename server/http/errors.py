"""The HTTP front-end's errors: every error is ``{"error": "<message>"}`` with the HTTP status of
``STATUS_TABLE`` (:func:`error_response`), errors FastAPI and Starlette raise outside our
handlers are answered the same way (:func:`install`: routing's 404 and 405 with ``Allow``, request
validation as 400, never 422), and the OpenAPI document lists them per route
(:data:`PREDICT_ERRORS` ..., :func:`openapi`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from processor.errors import InvalidArgument, ProcessorError

from ..runtime import ServingRuntime
from .json_stream import check_depth
from .predict import PredictRoutes, as_response, error_reply, tracked


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
STATUS_ERRORS = _errors(400, 404, 503)
ADMIN_ERRORS = _errors(400, 401, 403, 404, 500, 503)


class JsonDepthRoute(APIRoute):
    """A FastAPI route whose request body, where it takes one, is held to the one JSON nesting
    limit (:func:`~server.http.json_stream.check_depth`: 400) before FastAPI parses it, whose
    ``json.loads`` allows ~1,000 levels. The body read here is the one the route's handler
    reads (Starlette keeps it on the request)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def checked(request: Request) -> Response:
            check_depth(await request.body())
            return await handler(request)
        return checked


def install(app: FastAPI, predict: PredictRoutes | None = None) -> None:
    """Answer the errors raised outside handlers (routing, validation) as ours; patch the OpenAPI
    document to say so; hold every route's JSON body to the nesting limit (:class:`JsonDepthRoute`:
    install before any route is added). ``predict``: the inference fast path, whose URLs take
    POST (a 405's ``Allow``)."""
    app.router.route_class = JsonDepthRoute

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
            allowed = _allowed_methods(app, request.scope, predict)
            headers["Allow"] = ", ".join(allowed)
            message = f"method {request.method} not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        else:
            message = str(exc.detail)
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=headers or None)

    app.openapi = lambda: openapi(app)


def _allowed_methods(app: FastAPI, scope: dict, predict: PredictRoutes | None = None) -> list[str]:
    """Every method some route takes at this path (for ``Allow``)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    if predict is not None and predict.route(scope.get("path", "")) is not None:
        methods.add("POST")  # answered by RequestContext before routing
    return sorted(methods)


def openapi(app: FastAPI) -> dict[str, Any]:
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


async def tracked_response(rt: ServingRuntime, model: str, api: str,
                           work: Callable[[], Awaitable[Response]]) -> Response:
    """``work()`` counted as one request of ``model`` (metrics, access log, drain gate: see
    :func:`~server.http.predict.tracked`), its error answered as :func:`error_response`."""
    return await tracked(rt, model, api, work, error_response)
