"""The predict endpoints as plain ASGI handlers: ``POST /api/predict/{model}[/versions/{n}|/labels/{l}]``
(our wire format) and ``POST /v1/models/...:predict|classify|regress`` (TF Serving REST).

They are the hot path, so :class:`~server.http.app.RequestContext` sends them here directly,
skipping FastAPI's routing and request objects (about a fifth of a batch-1 request's CPU); the
FastAPI routes for the same URLs (what OpenAPI documents) call the same methods. Model work runs
on the model's thread pool; errors are mapped once, through ``STATUS_TABLE``.

Every inference route (these, KServe v2's) passes the ``X-Routing-Key`` header on as the call's
``routing_key`` (what a model's traffic split hashes: one key, one version) and answers with
``X-Model-Version``, the number of the version that answered (:func:`version_header`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from processor.memory import trim
from processor.errors import InvalidArgument, SignatureNotFound, Unavailable, edge_error
from processor.request import PredictCall, parse_version
from processor.signature import Signature

from .. import native_json, tfs_inference
from ..deadline import from_http_headers
from ..runtime import ServingRuntime
from ..tfs_messages import messages
from . import tfs_examples, tfs_json, tfs_json_encode
from .body import Receive, read_body
from .memory_budget import DEFAULT_BUDGET, Hold, MemoryBudget

log = logging.getLogger("server.http")
T = TypeVar("T")
Now = Callable[[bytes, list], "Reply"]  # a lean request's answer: (whole body, headers) -> Reply; never raises

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
EAS_PREFIX = "/api/predict/"
PREDICT_PATH = re.compile(  # ASCII digits (\d takes "²"); parse_version refuses over int64
    r"^/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?:(classify|regress|predict)$", re.I)


ROUTING_KEY = b"x-routing-key"
MODEL_VERSION = b"x-model-version"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes | bytearray
    content_type: str = JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()  # more response headers (Retry-After)


@dataclass(frozen=True, slots=True)
class Later:
    """A lean request's answer that is awaited on the connection's loop rather than given at
    once (a batching model's request waits for its batch, another model's runs on its pool):
    ``await run(body, headers)`` -> Reply (``body``: the connection's buffer, a bytearray);
    never raises."""

    run: Callable[[bytes | bytearray, list], Awaitable[Reply]]


def version_header(number: int | str) -> tuple[bytes, bytes]:
    """The ``X-Model-Version`` response header naming the version that answered (its number)."""
    return MODEL_VERSION, (b"%d" % number if number.__class__ is int else number.encode())


def _eas_reply(result) -> Reply:
    return Reply(200, result.outputs, JSON if result.introspection else PROTOBUF,
                 (version_header(result.version_number),))


def eas_call(model: str, body: bytes | bytearray, headers: list, version: int | None = None,
             label: str | None = None, timeout_ms: int | None = None) -> PredictCall:
    """The call of a wire-format request whose whole body is in hand (the lean path): its
    deadline counted from now (``timeout_ms``: the default of its ``X-Request-Timeout-Ms``),
    its routing key from its headers."""
    return PredictCall(model, body, version, label, deadline=from_http_headers(headers, timeout_ms),
                       routing_key=routing_key(headers))


def eas_target(path: str) -> tuple[str, str | None, str | None] | None:
    """What a path under ``/api/predict/`` names: (model, version text or None, label or None);
    None when it is no predict URL of ours (``{model}``, ``{model}/versions/{n}``,
    ``{model}/labels/{l}``). The version text is parsed by the caller (a bad one is a 400)."""
    rest = path[len(EAS_PREFIX):]
    if "/" not in rest:
        return (rest, None, None) if rest else None
    parts = rest.split("/")
    if len(parts) == 3 and parts[0] and parts[2]:
        if parts[1] == "versions":
            return parts[0], parts[2], None
        if parts[1] == "labels":
            return parts[0], None, parts[2]
    return None


def header(headers: list, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case) among ASGI ``headers``."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def routing_key(headers: list) -> str | None:
    """The request's ``X-Routing-Key`` (None: none sent): the call's ``routing_key``."""
    return header(headers, ROUTING_KEY)


def error_reply(exc: BaseException) -> Reply:
    """The one mapping of an error to HTTP: STATUS_TABLE's status and ``{"error": message}``."""
    err = edge_error(exc, "http", log)
    retry_after = getattr(exc, "retry_after", None)
    headers = ((b"retry-after", str(retry_after).encode()),) if retry_after else ()
    return Reply(err.edge.http, json.dumps({"error": err.message}).encode(), headers=headers)


def as_response(reply: Reply):
    """A Reply as a Starlette response, for the FastAPI routes."""
    from starlette.responses import Response

    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reply.headers}
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=headers or None)


async def tracked(rt: ServingRuntime, model: str, api: str, work: Callable[[], Awaitable[T]],
                  on_error: Callable[[Exception], T]) -> T:
    """``await work()`` as one HTTP ``api`` request to ``model`` (``rt.track``); a request the
    drain timeout cuts off is Unavailable; any error is answered with ``on_error(exc)``."""
    try:
        with rt.track(model, "http", api) as track:
            try:
                reply = await work()
            except asyncio.CancelledError:  # the drain timeout cut the request off
                raise Unavailable("the server shut down before the request finished") from None
            if track.traced is not None:
                track.traced.reply(reply)
            return reply
    except Exception as exc:
        return on_error(exc)


class PredictRoutes:
    """See the module doc."""

    def __init__(self, rt: ServingRuntime) -> None:
        self.rt = rt
        dep = rt.deployment
        self.limit = dep.max_request_bytes
        self.inline_bytes = dep.inline_max_request_bytes  # served on the event loop up to this size
        # TF Serving JSON: its own body limit, element limit and decode memory budget (issue 16)
        json_limit = getattr(dep, "json_max_request_bytes", None)
        self.json_limit, self.json_setting = ((json_limit, "json_max_request_bytes") if json_limit
                                              else (self.limit, "max_request_bytes"))
        self.json_limits = tfs_json.Limits(
            max_elements=getattr(dep, "json_max_elements", tfs_json.DEFAULT_MAX_ELEMENTS))
        self.json_budget = MemoryBudget(getattr(dep, "json_decode_memory_bytes", DEFAULT_BUDGET))
        # a request without X-Request-Timeout-Ms gets this one (TF Serving's --rest_api_timeout_in_ms)
        self.timeout_ms = getattr(dep, "http_request_timeout_ms", None)
        self._more: list[tuple[re.Pattern, Callable[[re.Match, Receive, list], Awaitable[Reply]],
                               Callable[[re.Match, list, int], Now | None] | None]] = []

    def deadline(self, headers: list) -> float | None:
        """A request's deadline: its ``X-Request-Timeout-Ms``, else ``http_request_timeout_ms``'s
        (:func:`server.deadline.from_http_headers`)."""
        return from_http_headers(headers, self.timeout_ms)

    def add(self, pattern: re.Pattern, handler: Callable[[re.Match, Receive, list], Awaitable[Reply]],
            lean: Callable[[re.Match, list, int], Now | None] | None = None) -> None:
        """Answer POSTs whose path matches ``pattern`` with ``handler(match, receive, headers)``
        on this fast path (another protocol's inference route: KServe v2's ``infer``);
        ``lean(match, headers, content_length)``: the route's answer on the lean path
        (:meth:`lean_admit`), or None where the request must take the ASGI path."""
        self._more.append((pattern, handler, lean))

    def route(self, path: str) -> Callable[[Receive, list], Awaitable[Reply]] | None:
        """The handler for a POST to ``path``, or None (not an inference URL)."""
        if path.startswith(EAS_PREFIX):
            target = eas_target(path)
            if target is None:
                return None
            model, version, label = target
            return lambda receive, headers: self.eas(model, receive, headers, version, label)
        if PREDICT_PATH.match(path):
            return lambda receive, headers: self.tfs(path, receive, headers)
        for pattern, handler, _ in self._more:
            m = pattern.match(path)
            if m is not None:
                return lambda receive, headers: handler(m, receive, headers)
        return None

    async def eas(self, model: str, receive: Receive, headers: list, version: str | None = None,
                  label: str | None = None) -> Reply:
        """Serialized PredictRequest in, PredictResponse out; empty body: the signature JSON.
        ``version``: the URL's version text (parsed here: a bad one is a 400), ``label``: its
        label; neither: the default version, or the model's traffic split."""
        rt = self.rt

        async def work() -> Reply:
            deadline = self.deadline(headers)  # counted from the request's arrival
            wanted = None if version is None else parse_version(version)
            body = await read_body(receive, headers, self.limit)
            return _eas_reply(await rt.predict_wire(PredictCall(model, body, wanted, label, deadline=deadline,
                                                                routing_key=routing_key(headers))))
        return await tracked(self.rt, model, "predict", work, error_reply)

    async def eas_later(self, model: str, body: bytes | bytearray, headers: list,
                        *named: int | str | None) -> Reply:
        """:meth:`eas` of a request :meth:`lean_admit` took for a model that does not run it in
        place, whole body in hand: queued on a batching model's queue and awaited on this loop,
        else on the model's pool (``ServingRuntime.predict_wire``). ``named``: the version
        (parsed) and label the URL names, given only when it names one. Never raises."""
        rt = self.rt

        async def work() -> Reply:
            return _eas_reply(await rt.predict_wire(eas_call(model, body, headers, *named, timeout_ms=self.timeout_ms)))
        return await tracked(rt, model, "predict", work, error_reply)

    def lean_admit(self, url: bytes, headers: list) -> Now | Later | None:
        """The answer of a POST to ``url`` that the HTTP connection may give itself, once the
        whole body is in, before any task or ASGI message (``LimitedHttpProtocol``'s lean path);
        None: the request takes the ASGI path. Taken: a ``Content-Length`` and no percent-escape
        in the URL, to our wire format (any of its URLs whose version parses; a body within
        ``max_request_bytes``: it is read as the ASGI route reads it), TF Serving REST or a
        route :meth:`add`-ed with ``lean`` (a body of at most ``inline_max_request_bytes``: a
        larger one is held against the decode memory budget as it arrives, on the ASGI path).
        Answered here and now for a body of at most ``inline_max_request_bytes`` to a model
        that runs such a request in place (our wire format: whose last request ran in place,
        ``DataPlane.inline_hint``, the engine decides per request; the others:
        ``ServingRuntime.in_place``, they decode on the caller's thread); else a
        :class:`Later`, awaited on the loop without the ASGI cycle: the model's batching queue
        or its pool."""
        if not self.inline_bytes or b"%" in url:
            return None
        length = header(headers, b"content-length")
        if length is None or not length.isdigit():
            return None
        size = int(length)
        path = url.split(b"?", 1)[0].decode("latin-1")
        if path.startswith(EAS_PREFIX):
            target = eas_target(path)
            if target is None or size > self.limit:  # over the limit: the ASGI route's 413
                return None
            model, version, label = target
            named: tuple = ()
            if version is not None or label is not None:
                try:  # a bad version takes the ASGI route, which answers it (400)
                    named = (None if version is None else parse_version(version), label)
                except InvalidArgument:
                    return None
            if size <= self.inline_bytes and self.rt.dataplane.inline_hint(model):
                return lambda body, headers_: self.eas_now(model, body, headers_, *named)
            return Later(lambda body, headers_: self.eas_later(model, body, headers_, *named))
        if size > self.inline_bytes:  # JSON and v2: the decode memory budget holds a large body as it comes
            return None
        m = PREDICT_PATH.match(path)
        if m is not None:
            return self._tfs_lean(m, int(length))
        for pattern, _, lean in self._more:
            m = pattern.match(path)
            if m is not None:
                return lean(m, headers, int(length)) if lean is not None else None
        return None

    def now_tracked(self, model: str, api: str, work: Callable[[], Reply]) -> Reply:
        """``work()`` as one HTTP ``api`` request to ``model``, here and now (``rt.track``); any
        error is answered through the one mapping. The lean path's :func:`tracked`."""
        try:
            with self.rt.track(model, "http", api) as track:
                reply = work()
                if track.traced is not None:
                    track.traced.reply(reply)
                return reply
        except Exception as exc:
            return error_reply(exc)

    def eas_now(self, model: str, body: bytes, headers: list, *named: int | str | None) -> Reply:
        """:meth:`eas` of a request :meth:`lean_admit` took, whole body in hand, on the event
        loop (the engine runs it in place; should the served version no longer run in place,
        this one request runs here anyway); ``named`` as :meth:`eas_later`'s. Never raises."""
        dataplane = self.rt.dataplane

        def work() -> Reply:
            call = eas_call(model, body, headers, *named, timeout_ms=self.timeout_ms)
            return _eas_reply(dataplane.try_inline(call, self.inline_bytes) or dataplane.predict(call))
        return self.now_tracked(model, "predict", work)

    async def tfs(self, path: str, receive: Receive, headers: list) -> Reply:
        m = PREDICT_PATH.match(path)
        if m is None:
            return error_reply(InvalidArgument(f"Malformed request: POST {path}"))
        name, method = m.group(1), m.group(4).lower()

        async def work() -> Reply:
            deadline = self.deadline(headers)
            with self.json_budget.hold() as hold:
                body = await read_body(receive, headers, self.json_limit, hold, self.json_setting)
                args = self._tfs_args(m, body, deadline, hold, routing_key(headers))
                return await self.rt.serve(name, len(body), tfs_reply, *args)
        return await tracked(self.rt, name, f"tfs_{method}", work, error_reply)

    def _tfs_args(self, m: re.Match, body: bytes | bytearray, deadline: float | None, hold: Hold,
                  key: str | None) -> tuple:
        """:func:`tfs_reply`'s arguments for a request to the path ``m`` matched."""
        return (self.rt, m.group(1), _tfs_version(m), m.group(3), m.group(4).lower(), body, deadline,
                self.json_limits, hold, key)

    def _tfs_lean(self, m: re.Match, length: int) -> Now | Later | None:
        """:meth:`tfs` on the lean path (see :meth:`lean_admit`); a version that is not a number
        takes the ASGI route, which answers it before it looks for the model, as TF Serving does."""
        if length > self.json_limit:
            return None
        try:
            _tfs_version(m)
        except InvalidArgument:
            return None
        return self.budgeted(m.group(1), f"tfs_{m.group(4).lower()}", length, lambda body, deadline, hold, key: (
            tfs_reply(*self._tfs_args(m, body, deadline, hold, key))))

    def budgeted(self, model: str, api: str, size: int,
                 run: Callable[[bytes, float | None, Hold, str | None], Reply]) -> Now | Later:
        """The lean answer of an ``api`` request of ``size`` bytes to ``model`` that
        ``run(body, deadline, hold, routing_key)`` decodes and answers, the body's bytes held
        from the decode memory budget (as ``read_body`` holds them on the ASGI path), tracked:
        here and now on the loop when the model runs such a request in place
        (``ServingRuntime.in_place``: :meth:`now_tracked`), else a :class:`Later` awaiting
        ``run`` on the model's pool."""
        rt, budget = self.rt, self.json_budget

        if rt.in_place(model, size):
            def now(body: bytes, headers: list) -> Reply:
                def work() -> Reply:
                    deadline = self.deadline(headers)
                    with budget.hold() as hold:
                        hold.need(len(body))
                        return run(body, deadline, hold, routing_key(headers))
                return self.now_tracked(model, api, work)
            return now

        async def later(body: bytes | bytearray, headers: list) -> Reply:
            async def work() -> Reply:
                deadline = self.deadline(headers)
                with budget.hold() as hold:
                    hold.need(len(body))
                    return await rt.run(model, run, body, deadline, hold, routing_key(headers))
            return await tracked(rt, model, api, work, error_reply)
        return Later(later)


def _tfs_version(m: re.Match) -> int | None:
    """The version a TF Serving REST path names (``PREDICT_PATH``'s match), or None;
    InvalidArgument when it is out of range."""
    version = m.group(2)
    return None if version is None else parse_version(version)


class TfsJsonInputs:
    """The inputs of a TF Serving REST predict: its parsed JSON body, a decoder of the served
    signature (the DataPlane calls it once, inside its acquire). After the call, ``format`` is
    the request's format (row or columnar; the reply is written in it). Once decoded, the
    parsed JSON is dropped and a large body's buffer (read_body's, ours) cleared, so their
    memory goes before the reply is written, not after. Used by one request's thread."""

    __slots__ = ("request", "signature_name", "format", "_body", "_charge")

    def __init__(self, request: tfs_json.Request, body: bytes | bytearray,
                 charge: Callable[[int], None] | None) -> None:
        self.request: tfs_json.Request | None = request
        self.signature_name = request.signature_name
        self.format = None
        self._body = body if isinstance(body, bytearray) and len(body) >= tfs_json.SMALL_BODY else None
        self._charge = charge

    def __call__(self, signature: Signature):
        request, self.request = self.request, None
        arrays, self.format = tfs_json.decode_request(request, signature, self._charge)
        del request  # decoded: the parsed JSON's memory goes now
        if self._body is not None:
            try:
                self._body.clear()
            except BufferError:  # pragma: no cover - a view of it is still alive
                pass
            self._body = None
        return arrays


class ScannedTfsInputs:
    """:class:`TfsJsonInputs` of a body ``native_json.scan_tfs`` read (no Python object per
    value): the signature's arrays made natively (``tfs_json.decode_scan``), or where it does
    not take them, the body parsed and decoded by the reference. Used by one request's thread."""

    __slots__ = ("scan", "signature_name", "format", "_body", "_limits", "_charge")

    def __init__(self, scan, body: bytes | bytearray, limits: tfs_json.Limits,
                 charge: Callable[[int], None] | None) -> None:
        self.scan = scan
        self.signature_name = scan.signature_name or ""
        self.format = tfs_json.COLUMNAR if scan.columnar else tfs_json.ROW
        self._body, self._limits, self._charge = body, limits, charge

    def __call__(self, signature: Signature):
        arrays = tfs_json.decode_scan(self.scan, signature, self._limits, self._charge)
        self.scan = None
        if arrays is None:
            reference = TfsJsonInputs(tfs_json.parse_request(self._body, self._limits), self._body, self._charge)
            arrays = reference(signature)
            self.format = reference.format
        return arrays


def tfs_inputs(body: bytes | bytearray, limits: tfs_json.Limits = tfs_json.Limits(),
               charge: Callable[[int], None] | None = None) -> TfsJsonInputs | ScannedTfsInputs:
    """The inputs of a TF Serving REST predict body: read natively where it is small and of the
    plain form (:class:`ScannedTfsInputs`), else parsed (:class:`TfsJsonInputs`); raises the
    parse's InvalidArgument."""
    if len(body) <= tfs_json.SMALL_BODY:
        scan = native_json.scan_tfs(body)
        if scan is not None:
            return ScannedTfsInputs(scan, body, limits, charge)
    return TfsJsonInputs(tfs_json.parse_request(body, limits), body, charge)


def tfs_reply(rt: ServingRuntime, name: str, version: int | None, label: str | None, method: str,
              body: bytes | bytearray, deadline: float | None = None, limits: tfs_json.Limits = tfs_json.Limits(),
              hold: Hold | None = None, key: str | None = None) -> Reply:
    """TF Serving REST ``method`` (predict, classify, regress; on the model's thread pool): JSON
    in, JSON out, with ``X-Model-Version``. ``key``: the call's routing key. Predict's shapes are
    TF Serving's: the graph decides (``check_shapes=False``)."""
    if method != "predict":
        return tfs_classify_regress(rt, name, version, label, method, body, deadline, limits.max_depth, key)
    size = len(body)
    try:
        inputs = tfs_inputs(body, limits, hold.charge if hold else None)
        try:
            result = rt.dataplane.predict(PredictCall(name, inputs, version=version, label=label,
                                                      signature_name=inputs.signature_name, deadline=deadline,
                                                      check_shapes=False, routing_key=key))
        except SignatureNotFound as exc:  # TF Serving's REST wording
            raise InvalidArgument(f"Serving signature name: {json.dumps(exc.name[:80])} not found in "
                                  f"signature def") from None
        return Reply(200, tfs_json_encode.encode_predict(result.outputs, inputs.format),
                     headers=(version_header(result.version_number),))
    finally:
        if size >= tfs_json.SMALL_BODY:
            trim()  # hand the freed decode memory back to the OS


def tfs_predict(rt: ServingRuntime, name: str, version: int | None, label: str | None, method: str,
                body: bytes | bytearray, deadline: float | None = None,
                limits: tfs_json.Limits = tfs_json.Limits(), hold: Hold | None = None) -> bytes | bytearray:
    """:func:`tfs_reply`'s body alone (in-process callers that want the JSON only)."""
    return tfs_reply(rt, name, version, label, method, body, deadline, limits, hold).body


def tfs_classify_regress(rt: ServingRuntime, name: str, version: int | None, label: str | None, method: str,
                         body: bytes | bytearray, deadline: float | None = None,
                         max_depth: int = tfs_json.MAX_DEPTH, key: str | None = None) -> Reply:
    """TF Serving REST ``:classify`` / ``:regress`` (on the model's thread pool): the examples
    JSON (:mod:`server.http.tfs_examples`) in, ``{"results": ...}`` out, with ``X-Model-Version``;
    ``key``: the call's routing key."""
    types = messages()
    request = types.ClassificationRequest() if method == "classify" else types.RegressionRequest()
    request.model_spec.name = name
    tfs_examples.fill_request(body, request, max_depth)
    run = tfs_inference.classify if method == "classify" else tfs_inference.regress
    response = run(rt.dataplane, request, deadline, (version, label), key)
    return Reply(200, json.dumps(tfs_inference.result_json(method, response)).encode(),
                 headers=(version_header(response.model_spec.version.value),))
