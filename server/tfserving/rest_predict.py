"""TF Serving REST inference: ``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict``
(row and columnar JSON, b64), ``:classify`` and ``:regress`` (``examples``, ``context``), JSON
in, JSON out, with ``X-Model-Version``.

:class:`TfsPredict` answers them on the HTTP fast path (added to
:class:`~server.http.predict.PredictRoutes` at start-up; the lean path too), and
:func:`tfs_reply` is the work, on the model's thread pool: the body decoded against the served
signature (:mod:`.rest_json`; parsed whole or a run at a time by
:func:`server.http.json_stream.parse_whole`'s rule), the call, the answer encoded
(:mod:`.rest_json_encode`); classify and regress through :mod:`.inference`. Paths are
case-insensitive, as TF Serving's regexes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from processor.errors import InvalidArgument, SignatureNotFound
from processor.memory import trim
from processor.request import PredictCall, Work, parse_version
from processor.signature import Signature

from .. import native_json
from ..http.body import Receive, read_body
from ..http.json_stream import parse_whole
from ..http.memory_budget import Hold
from ..http.predict import Later, Now, PredictRoutes, Reply, error_reply, routing_key, tracked, version_header
from ..runtime import ServingRuntime
from . import inference, rest_examples, rest_json, rest_json_encode
from .messages import messages

PREDICT_PATH = re.compile(  # ASCII digits (\d takes "²"); parse_version refuses over int64
    r"^/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?:(classify|regress|predict)$", re.I)


class TfsPredict:
    """The inference URLs' answers: the ASGI handler (:meth:`asgi`; :meth:`post` for any POST
    under ``/v1/models``) and the lean path's (:meth:`lean`). ``routes``: the fast path it is
    added to, whose JSON limits, decode memory budget, deadline and tracking it uses."""

    def __init__(self, routes: PredictRoutes) -> None:
        self.routes = routes
        self.rt = routes.rt
        self.limits = rest_json.Limits(max_elements=routes.json_max_elements)

    async def post(self, path: str, receive: Receive, headers: list) -> Reply:
        """A POST to ``path``: :meth:`asgi` for an inference URL, else TF Serving's
        "Malformed request"."""
        m = PREDICT_PATH.match(path)
        if m is None:
            return error_reply(InvalidArgument(f"Malformed request: POST {path}"))
        return await self.asgi(m, receive, headers)

    async def asgi(self, m: re.Match, receive: Receive, headers: list) -> Reply:
        """The request to the URL ``m`` (:data:`PREDICT_PATH`) matched: its body read (held
        against the decode memory budget as it arrives) and answered where
        ``ServingRuntime.dispatch`` puts it."""
        routes, rt = self.routes, self.rt
        name, method = m.group(1), m.group(4).lower()

        async def work() -> Reply:
            deadline = routes.deadline(headers)
            with routes.json_budget.hold() as hold:
                body = await read_body(receive, headers, routes.json_limit, hold, routes.json_setting)
                args = self._args(m, body, deadline, hold, routing_key(headers))
                return await rt.dispatch(Work(name, len(body), tfs_reply, args))
        return await tracked(rt, name, f"tfs_{method}", work, error_reply)

    def _args(self, m: re.Match, body: bytes | bytearray, deadline: float | None, hold: Hold,
              key: str | None) -> tuple:
        """:func:`tfs_reply`'s arguments for a request to the path ``m`` matched."""
        return (self.rt, m.group(1), _tfs_version(m), m.group(3), m.group(4).lower(), body, deadline,
                self.limits, hold, key)

    def lean(self, m: re.Match, headers: list, length: int) -> Now | Later | None:
        """:meth:`asgi` on the lean path (``PredictRoutes.lean_admit``): a body of at most
        ``inline_max_request_bytes`` within the JSON limit; a version that is not a number
        takes the ASGI route, which answers it before it looks for the model, as TF Serving does."""
        routes = self.routes
        if length > routes.inline_bytes or length > routes.json_limit:
            return None
        try:
            _tfs_version(m)
        except InvalidArgument:
            return None
        return routes.budgeted(m.group(1), f"tfs_{m.group(4).lower()}", length, lambda body, deadline, hold, key: (
            tfs_reply(*self._args(m, body, deadline, hold, key))))


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

    def __init__(self, request: rest_json.Request, body: bytes | bytearray,
                 charge: Callable[[int], None] | None) -> None:
        self.request: rest_json.Request | None = request
        self.signature_name = request.signature_name
        self.format = None
        self._body = body if isinstance(body, bytearray) and len(body) >= rest_json.SMALL_BODY else None
        self._charge = charge

    def __call__(self, signature: Signature):
        request, self.request = self.request, None
        arrays, self.format = rest_json.decode_request(request, signature, self._charge)
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
    value): the signature's arrays made natively (``rest_json.decode_scan``), or where it does
    not take them, the body parsed and decoded by the reference. Used by one request's thread."""

    __slots__ = ("scan", "signature_name", "format", "_body", "_limits", "_charge")

    def __init__(self, scan, body: bytes | bytearray, limits: rest_json.Limits,
                 charge: Callable[[int], None] | None) -> None:
        self.scan = scan
        self.signature_name = scan.signature_name or ""
        self.format = rest_json.COLUMNAR if scan.columnar else rest_json.ROW
        self._body, self._limits, self._charge = body, limits, charge

    def __call__(self, signature: Signature):
        arrays = rest_json.decode_scan(self.scan, signature, self._limits, self._charge)
        self.scan = None
        if arrays is None:
            reference = TfsJsonInputs(rest_json.parse_request(self._body, self._limits), self._body, self._charge)
            arrays = reference(signature)
            self.format = reference.format
        return arrays


def tfs_inputs(body: bytes | bytearray, limits: rest_json.Limits = rest_json.Limits(),
               charge: Callable[[int], None] | None = None,
               whole: bool | None = None) -> TfsJsonInputs | ScannedTfsInputs:
    """The inputs of a TF Serving REST predict body: read natively where it is small and of the
    plain form (:class:`ScannedTfsInputs`), else parsed (:class:`TfsJsonInputs`; ``whole``: parsed
    whole rather than a run at a time, :func:`~server.tfserving.rest_json.parse_request`'s);
    raises the parse's InvalidArgument."""
    if len(body) <= rest_json.SMALL_BODY:
        scan = native_json.scan_tfs(body)
        if scan is not None:
            return ScannedTfsInputs(scan, body, limits, charge)
    return TfsJsonInputs(rest_json.parse_request(body, limits, whole), body, charge)


def tfs_reply(rt: ServingRuntime, name: str, version: int | None, label: str | None, method: str,
              body: bytes | bytearray, deadline: float | None = None, limits: rest_json.Limits = rest_json.Limits(),
              hold: Hold | None = None, key: str | None = None) -> Reply:
    """TF Serving REST ``method`` (predict, classify, regress; on the model's thread pool): JSON
    in, JSON out, with ``X-Model-Version``. ``key``: the call's routing key. Predict's shapes are
    TF Serving's: the graph decides (``check_shapes=False``)."""
    if method != "predict":
        return tfs_classify_regress(rt, name, version, label, method, body, deadline, limits.max_depth, key)
    size = len(body)
    try:
        # a large body parsed whole when the decode budget holds orjson's peak for it now
        inputs = tfs_inputs(body, limits, hold.charge if hold else None, parse_whole(size, hold))
        try:
            result = rt.dataplane.predict(PredictCall(name, inputs, version=version, label=label,
                                                      signature_name=inputs.signature_name, deadline=deadline,
                                                      check_shapes=False, routing_key=key))
        except SignatureNotFound as exc:  # TF Serving's REST wording
            raise InvalidArgument(f"Serving signature name: {json.dumps(exc.name[:80])} not found in "
                                  f"signature def") from None
        return Reply(200, rest_json_encode.encode_predict(result.outputs, inputs.format),
                     headers=(version_header(result.version_number),))
    finally:
        if size >= rest_json.SMALL_BODY:
            trim()  # hand the freed decode memory back to the OS


def tfs_predict(rt: ServingRuntime, name: str, version: int | None, label: str | None, method: str,
                body: bytes | bytearray, deadline: float | None = None,
                limits: rest_json.Limits = rest_json.Limits(), hold: Hold | None = None) -> bytes | bytearray:
    """:func:`tfs_reply`'s body alone (in-process callers that want the JSON only)."""
    return tfs_reply(rt, name, version, label, method, body, deadline, limits, hold).body


def tfs_classify_regress(rt: ServingRuntime, name: str, version: int | None, label: str | None, method: str,
                         body: bytes | bytearray, deadline: float | None = None,
                         max_depth: int = rest_json.MAX_DEPTH, key: str | None = None) -> Reply:
    """TF Serving REST ``:classify`` / ``:regress`` (on the model's thread pool): the examples
    JSON (:mod:`.rest_examples`) in, ``{"results": ...}`` out, with ``X-Model-Version``;
    ``key``: the call's routing key."""
    types = messages()
    request = types.ClassificationRequest() if method == "classify" else types.RegressionRequest()
    request.model_spec.name = name
    rest_examples.fill_request(body, request, max_depth)
    run = inference.classify if method == "classify" else inference.regress
    response = run(rt.dataplane, request, deadline, (version, label), key)
    return Reply(200, json.dumps(inference.result_json(method, response)).encode(),
                 headers=(version_header(response.model_spec.version.value),))
