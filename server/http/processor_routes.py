"""Our own HTTP protocol: ``POST /api/predict/{model}`` (a serialized ``tensorflow.eas.PredictRequest``
in, ``PredictResponse`` bytes out; an empty body returns the signature JSON, as ``process()``
does), ``POST /api/predict/{model}/versions/{n}`` and ``.../labels/{l}`` (the same, on that
version: 404 when it is not served, 400 for a version that is not a number), ``GET /api/models``
and ``GET /api/models/{model}`` (model info), ``GET /api/memory`` (what the models hold). Every predict answer names the version that
answered in ``X-Model-Version``; ``X-Routing-Key`` picks the arm of a model's traffic split."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..runtime import ServingRuntime
from .errors import INFO_ERRORS, PREDICT_ERRORS, tracked_response
from .predict import PROTOBUF, PredictRoutes, as_response


def register(app: FastAPI, rt: ServingRuntime, predict: PredictRoutes) -> None:
    """Add the routes to ``app``; ``predict``: the hot path's handlers (which answer predict
    requests before routing: the route is there for OpenAPI and calls the same handler)."""

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
        return as_response(await predict.eas(model, request.receive, request.scope["headers"]))

    @app.post("/api/predict/{model}/versions/{version}", **documented("Predict on one version"))
    async def eas_predict_version(model: str, version: str, request: Request) -> Response:
        return as_response(await predict.eas(model, request.receive, request.scope["headers"], version))

    @app.post("/api/predict/{model}/labels/{label}", **documented("Predict on a labelled version"))
    async def eas_predict_label(model: str, label: str, request: Request) -> Response:
        return as_response(await predict.eas(model, request.receive, request.scope["headers"], None, label))

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
