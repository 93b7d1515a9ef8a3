"""Admin endpoints: ``POST /admin/models/{model}/reload``, ``POST /admin/models/{model}/rollback``,
``PUT|DELETE /admin/models/{model}/pin``, ``GET|PUT /admin/models/{model}/routing`` (labels,
traffic split, shadow: :mod:`processor.routing`), and who may call them (:class:`AdminGate`).
Every admin call is logged with the caller's address; the work runs on the default executor,
never on the event loop."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ..repository import off_loop
from ..runtime import ServingRuntime
from .errors import ADMIN_ERRORS, error_response

log = logging.getLogger("server.http")


class PinBody(BaseModel):
    version: int = Field(ge=0, description="the step to serve: a full checkpoint step, or a delta step "
                                           "(its full plus that delta)")


class RollbackBody(BaseModel):
    version: int | None = Field(None, ge=0, description="version to serve; omitted: the previous one")


class RoutingBody(BaseModel):
    """A routing change: each part given replaces that part whole, ``null`` clears it; a part
    left out stays. Checked whole against the served versions (400 naming the problem, nothing
    changed)."""

    model_config = ConfigDict(extra="forbid")

    version_labels: dict[str, int] | None = Field(None, description='label -> version: {"stable": 1, "canary": 2}')
    traffic: dict[str, float] | None = Field(None, description='arm (a label or a version number) -> weight: '
                                                                '{"stable": 95, "canary": 5}')
    shadow: dict[str, Any] | None = Field(None, description='{"label": "canary", "fraction": 0.1} or '
                                                             '{"version": 2}: a copy of that share of calls')


def register(app: FastAPI, rt: ServingRuntime) -> None:
    """Add the admin routes to ``app``, behind the deployment's :class:`AdminGate`."""
    gate = AdminGate.of(rt)

    async def admin(request: Request, model: str, action: str, fn: Callable[[str], dict]) -> Response:
        return await guarded(gate, request, action, model, fn, check=lambda: rt.model(model))

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

    @app.get("/admin/models/{model}/routing", tags=["admin"], responses=ADMIN_ERRORS,
             summary="The model's labels, traffic split and shadow")
    async def admin_routing(model: str, request: Request) -> Response:
        return await admin(request, model, "routing", lambda _: {"model": model,
                                                                 "routing": rt.model(model).router.describe()})

    @app.put("/admin/models/{model}/routing", tags=["admin"], responses=ADMIN_ERRORS,
             summary="Change the model's labels, traffic split or shadow (every worker)")
    async def admin_route(model: str, body: RoutingBody, request: Request) -> Response:
        changes = body.model_dump(exclude_unset=True)  # a part sent as null clears it
        return await admin(request, model, "routing change", lambda caller: rt.route(model, changes, caller=caller))


async def guarded(gate: AdminGate, request: Request, action: str, target: str, fn: Callable[[str], Any],
                  check: Callable[[], Any] | None = None) -> Response:
    """One admin request: refused (401 / 403, logged with the caller) unless ``gate`` lets it
    in; else logged with the caller, ``check()`` (raises, e.g. NotFound for an unknown model)
    and ``fn(caller)`` on the default executor, its result answered as JSON, an error through
    STATUS_TABLE."""
    caller = _caller(request)
    tls = request.scope.get("extensions", {}).get("tls", {})  # server/http/protocol.py
    denied = gate.check(request.headers.get("authorization", ""), request.headers.get("x-admin-token", ""),
                        tls.get("client_cert_names"))
    if denied is not None:
        status, message = denied
        log.warning("admin %s of %s by %s refused (%d): %s", action, target, caller, status, message,
                    extra={"client": caller, "model": target})
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    log.info("admin %s of %s requested by %s", action, target, caller, extra={"client": caller, "model": target})
    try:
        if check is not None:
            check()
        result = await off_loop(fn, caller)
    except Exception as exc:
        return error_response(exc)
    return JSONResponse(result)


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

    @classmethod
    def of(cls, rt: ServingRuntime) -> AdminGate:
        """The server's gate: its admin token, ``admin_allow_without_token``, ``admin_client_cert``
        (the one rule every admin API, HTTP and gRPC, is checked by)."""
        dep = rt.deployment
        return cls(rt.admin_token, dep.admin_allow_without_token,
                   tuple(dep.admin_client_cert_names) if dep.admin_client_cert else None)

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
