"""Probes and metrics: ``/healthz`` and ``/v2/health/live`` (liveness), ``/readyz`` and
``/v2/health/ready`` (every model loaded and warm, not draining; the versions each serves),
``/v2/models/{name}/ready``;
Prometheus at ``/metrics`` and TF Serving's ``/monitoring/prometheus/metrics`` (and at the
deployment's ``prometheus_path``, a TF Serving MonitoringConfig's path, when set); ``/`` names
the service and its models."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from processor.errors import ProcessorError

from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE
from ..runtime import ServingRuntime
from .errors import INFO_ERRORS, error_response


def register(app: FastAPI, rt: ServingRuntime) -> None:
    """Add the probe routes to ``app``."""

    @app.get("/healthz", tags=["health"], summary="Liveness")
    @app.get("/v2/health/live", tags=["health"], summary="Liveness (KServe v2 path)")
    async def live() -> dict:
        return {"live": True}

    @app.get("/readyz", tags=["health"], summary="Readiness: every model loaded and warm",
             responses={503: {"description": "a model not ready, or the server draining"}})
    @app.get("/v2/health/ready", tags=["health"], summary="Readiness (KServe v2 path)")
    async def ready() -> JSONResponse:
        states, readiness = rt.states(), rt.readiness()
        body: dict[str, Any] = {"ready": rt.ready, "draining": rt.gate.draining, "models": states,
                                "versions": {m.name: [v.number for v in m.served_versions()] for m in rt.models}}
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


def register_metrics(app: FastAPI, rt: ServingRuntime) -> None:
    """Add Prometheus' routes and the index to ``app``."""

    @app.get("/metrics", tags=["metrics"], summary="Prometheus metrics")
    @app.get("/monitoring/prometheus/metrics", tags=["metrics"], summary="Prometheus metrics (TF Serving path)")
    async def metrics(request: Request) -> Response:
        # a scraper that takes OpenMetrics gets it: the latency exemplars (traced requests' ids)
        if "application/openmetrics-text" in request.headers.get("accept", ""):
            return Response(rt.metrics.render(openmetrics=True), media_type=OPENMETRICS_CONTENT_TYPE)
        return Response(rt.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    extra = getattr(rt.deployment, "prometheus_path", None)
    if extra is not None and extra not in ("/metrics", "/monitoring/prometheus/metrics"):
        app.add_api_route(extra, metrics, methods=["GET"], include_in_schema=False)

    @app.get("/", include_in_schema=False)
    async def index() -> dict:
        return {"service": "serving-processor", "models": rt.models.names,
                "docs": "/docs" if rt.deployment.enable_docs else None}
