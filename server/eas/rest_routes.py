"""Our own HTTP protocol: ``POST /api/predict/{model}`` (a serialized ``tensorflow.eas.PredictRequest``
in, ``PredictResponse`` bytes out; an empty body returns the signature JSON, as ``process()``
does), ``POST /api/predict/{model}/versions/{n}`` and ``.../labels/{l}`` (the same, on that
version: 404 when it is not served, 400 for a version that is not a number), ``GET /api/models``
and ``GET /api/models/{model}`` (model info), ``GET /api/memory`` (what the models hold). Every predict answer names the version that
answered in ``X-Model-Version``; ``X-Routing-Key`` picks the arm of a model's traffic split.

The predict URLs are answered on the HTTP fast path (:class:`EasPredict`, added to
:class:`~server.http.predict.PredictRoutes`; the lean path too); their FastAPI routes are there
for OpenAPI and call the same handler. The body goes to the DataPlane as it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from processor.errors import InvalidArgument
from processor.request import PredictCall, PredictResult, parse_version

from ..deadline import from_http_headers
from ..http.body import Receive, read_body
from ..http.errors import INFO_ERRORS, PREDICT_ERRORS, tracked_response
from ..http.predict import (JSON, Later, Now, PredictRoutes, Reply, as_response, error_reply, routing_key, tracked,
                            version_header)
from ..runtime import ServingRuntime

PROTOBUF = "application/x-protobuf"
PREFIX = "/api/predict/"


def register(app: FastAPI, rt: ServingRuntime, predict: PredictRoutes) -> None:
    """Add the routes to ``app`` and the predict URLs to ``predict`` (the fast path, which
    answers predict requests before routing: the FastAPI routes are there for OpenAPI and call
    the same handler)."""
    eas = EasPredict(predict)
    predict.add(predict_target, eas.asgi, eas.lean, PREFIX)

    def documented(summary: str) -> dict:
        """The OpenAPI description of a predict route."""
        return {"tags": ["processor"], "summary": summary, "openapi_extra": {"requestBody": {
            "content": {PROTOBUF: {"schema": {"type": "string", "format": "binary"}}}, "description":
                "serialized tensorflow.eas.PredictRequest; empty: returns the signature as JSON"}},
            "responses": {200: {"content": {PROTOBUF: {}}, "description": "serialized PredictResponse",
                                "headers": {"X-Model-Version": {"description": "the version that answered",
                                                                "schema": {"type": "integer"}}}},
                          **PREDICT_ERRORS}}

    # RequestContext answers these requests itself (PredictRoutes); these routes document them
    @app.post("/api/predict/{model}", **documented("Predict (tensorflow.eas wire format)"))
    async def eas_predict(model: str, request: Request) -> Response:
        return as_response(await eas.predict(model, request.receive, request.scope["headers"]))

    @app.post("/api/predict/{model}/versions/{version}", **documented("Predict on one version"))
    async def eas_predict_version(model: str, version: str, request: Request) -> Response:
        return as_response(await eas.predict(model, request.receive, request.scope["headers"], version))

    @app.post("/api/predict/{model}/labels/{label}", **documented("Predict on a labelled version"))
    async def eas_predict_label(model: str, label: str, request: Request) -> Response:
        return as_response(await eas.predict(model, request.receive, request.scope["headers"], None, label))

    @app.get("/api/models", tags=["processor"], summary="Served models and their states")
    async def list_models() -> dict:
        return {"models": [{"name": m.name, "state": m.state, "ready": m.ready,
                            "version": rt.version_label(m.name)} for m in rt.models]}

    @app.get("/api/memory", tags=["processor"], summary="Memory held per model, version and part")
    async def memory() -> dict:
        return await asyncio.get_running_loop().run_in_executor(None, rt.memory)

    @app.get("/api/models/{model}", tags=["processor"], summary="Model info", responses=INFO_ERRORS)
    async def model_info(model: str) -> Response:
        async def work() -> Response:
            return JSONResponse(model_details(rt, model))
        return await tracked_response(rt, model, "model_info", work)


def model_details(rt: ServingRuntime, name: str) -> dict:
    """Model info: state, served version, signature, session group, validated config."""
    return rt.model(name).info()


def predict_target(path: str) -> tuple[str, str | None, str | None] | None:
    """What a path under ``/api/predict/`` names: (model, version text or None, label or None);
    None when it is no predict URL of ours (``{model}``, ``{model}/versions/{n}``,
    ``{model}/labels/{l}``). The version text is parsed by the caller (a bad one is a 400). A
    split, not a regex: the fast path's first test of every request."""
    rest = path[len(PREFIX):]
    if "/" not in rest:
        return (rest, None, None) if rest else None
    parts = rest.split("/")
    if len(parts) == 3 and parts[0] and parts[2]:
        if parts[1] == "versions":
            return parts[0], parts[2], None
        if parts[1] == "labels":
            return parts[0], None, parts[2]
    return None


async def _replied(result: Awaitable[PredictResult]) -> Reply:
    return _reply(await result)


def _reply(result) -> Reply:
    return Reply(200, result.outputs, JSON if result.introspection else PROTOBUF,
                 (version_header(result.version_number),))


def eas_call(model: str, body: bytes | bytearray, headers: list, version: int | None = None,
             label: str | None = None, timeout_ms: int | None = None) -> PredictCall:
    """The call of a wire-format request whose whole body is in hand (the lean path): its
    deadline counted from now (``timeout_ms``: the default of its ``X-Request-Timeout-Ms``),
    its routing key from its headers."""
    return PredictCall(model, body, version, label, deadline=from_http_headers(headers, timeout_ms),
                       routing_key=routing_key(headers))


class EasPredict:
    """The predict URLs' answers: the ASGI handler (:meth:`asgi`, :meth:`predict`) and the lean
    path's (:meth:`lean`: :meth:`now` or :meth:`later`). ``routes``: the fast path it is added
    to, whose limits, deadline and tracking it uses."""

    def __init__(self, routes: PredictRoutes) -> None:
        self.routes = routes
        self.rt = routes.rt

    def asgi(self, target: tuple[str, str | None, str | None], receive: Receive, headers: list):
        """:meth:`predict` of the URL that named ``target`` (:func:`predict_target`)."""
        return self.predict(target[0], receive, headers, target[1], target[2])

    async def predict(self, model: str, receive: Receive, headers: list, version: str | None = None,
                      label: str | None = None) -> Reply:
        """Serialized PredictRequest in, PredictResponse out; empty body: the signature JSON.
        ``version``: the URL's version text (parsed here: a bad one is a 400), ``label``: its
        label; neither: the default version, or the model's traffic split."""
        routes, rt = self.routes, self.rt

        async def work() -> Reply:
            deadline = routes.deadline(headers)  # counted from the request's arrival
            wanted = None if version is None else parse_version(version)
            body = await read_body(receive, headers, routes.limit)
            return _reply(await rt.dispatch(PredictCall(model, body, wanted, label, deadline=deadline,
                                                        routing_key=routing_key(headers))))
        return await tracked(rt, model, "predict", work, error_reply)

    def lean(self, target: tuple[str, str | None, str | None], headers: list, size: int) -> Now | Later | None:
        """:meth:`predict` on the lean path (``PredictRoutes.lean_admit``): any of the URLs whose
        version parses (a bad one takes the ASGI route, which answers it: 400), a body within
        ``max_request_bytes`` (over it: the ASGI route's 413). Answered now when the model's plan
        runs it in place (``ServingRuntime.runs_here``: at most ``inline_max_request_bytes``
        long, the native engine), else :meth:`later`."""
        routes = self.routes
        if size > routes.limit:
            return None
        model, version, label = target
        named: tuple = ()
        if version is not None or label is not None:
            try:  # a bad version takes the ASGI route, which answers it (400)
                named = (None if version is None else parse_version(version), label)
            except InvalidArgument:
                return None
        if self.rt.runs_here(model, size, True):
            return lambda body, headers_: self.now(model, body, headers_, *named)
        return Later(lambda body, headers_: self.later(model, body, headers_, *named))

    async def later(self, model: str, body: bytes | bytearray, headers: list, *named: int | str | None) -> Reply:
        """:meth:`predict` of a request :meth:`lean` took for a model that does not run it in
        place, whole body in hand, where ``ServingRuntime.dispatch`` puts it (a batching model's
        queue, awaited on this loop; else the model's pool). ``named``: the version
        (parsed) and label the URL names, given only when it names one. Never raises."""
        rt, timeout_ms = self.rt, self.routes.timeout_ms

        async def work() -> Reply:
            return _reply(await rt.dispatch(eas_call(model, body, headers, *named, timeout_ms=timeout_ms)))
        return await tracked(rt, model, "predict", work, error_reply)

    def now(self, model: str, body: bytes, headers: list, *named: int | str | None) -> Reply | Later:
        """:meth:`predict` of a request :meth:`lean` took, whole body in hand, on the event loop
        (``ServingRuntime.dispatch_here``); one the engine declines after all (a one-row
        context...), or whose model's plan changed since its headers, goes on in a task on the
        model's pool, holding the version it was routed to (``PredictRoutes.now_tracked``);
        ``named`` as :meth:`later`'s. Never raises."""
        routes, rt = self.routes, self.rt

        def work() -> Reply | Awaitable[Reply]:
            out = rt.dispatch_here(eas_call(model, body, headers, *named, timeout_ms=routes.timeout_ms))
            return _reply(out) if out.__class__ is PredictResult else _replied(out)
        return routes.now_tracked(model, "predict", work)
