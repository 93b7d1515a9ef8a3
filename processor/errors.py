"""One error hierarchy and one status table for every edge (HTTP, gRPC, C ABI).

Every failure the processor reports is a :class:`ProcessorError` carrying a :class:`StatusCode`.
Front-ends never invent codes: they look the code up in :data:`STATUS_TABLE` once, at the edge.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass


class StatusCode(enum.IntEnum):
    """The processor's status codes, named as gRPC's canonical codes; the integer is the HTTP
    status (but FAILED_PRECONDITION's, 412 only to stay a member of its own: it is sent as 400,
    as TF Serving sends it). What each edge sends is :data:`STATUS_TABLE`'s row, never the
    integer itself."""

    OK = 200
    INVALID_ARGUMENT = 400  # the request or config is wrong
    NOT_FOUND = 404  # unknown model or version
    FAILED_PRECONDITION = 412  # TF Serving's Predict naming a signature the model does not have
    RESOURCE_EXHAUSTED = 413  # request over a configured size or memory limit (server edges)
    INTERNAL = 500  # a failure inside the processor or the engine
    UNAVAILABLE = 503  # no version ready yet, a store down, shutting down, a full queue
    DEADLINE_EXCEEDED = 504  # the request's deadline passed before it ran


@dataclass(frozen=True)
class EdgeStatus:
    """How one :class:`StatusCode` appears on each transport."""

    http: int
    grpc: str  # name of the grpc.StatusCode member; processor/ never imports grpc
    # What processor.abi returns. libserving_processor.so passes on the statuses processor.h
    # documents, C_ABI_STATUSES: RESOURCE_EXHAUSTED (a request over max_request_rows; the C path
    # sets no size limit of its own) is its 400, a bad request; the C path never produces
    # DEADLINE_EXCEEDED (it passes no deadline), and the library answers any status outside that
    # list as 500.
    c_abi: int


STATUS_TABLE: dict[StatusCode, EdgeStatus] = {
    StatusCode.OK: EdgeStatus(200, "OK", 200),
    StatusCode.INVALID_ARGUMENT: EdgeStatus(400, "INVALID_ARGUMENT", 400),
    StatusCode.NOT_FOUND: EdgeStatus(404, "NOT_FOUND", 404),
    StatusCode.FAILED_PRECONDITION: EdgeStatus(400, "FAILED_PRECONDITION", 400),
    StatusCode.RESOURCE_EXHAUSTED: EdgeStatus(413, "RESOURCE_EXHAUSTED", 400),
    StatusCode.INTERNAL: EdgeStatus(500, "INTERNAL", 500),
    StatusCode.UNAVAILABLE: EdgeStatus(503, "UNAVAILABLE", 503),
    StatusCode.DEADLINE_EXCEEDED: EdgeStatus(504, "DEADLINE_EXCEEDED", 504),
}

# The statuses cpp_processor/include/processor.h documents (PROCESSOR_STATUS_*), exactly what
# the C path can return; the library turns any other status it is handed into 500.
C_ABI_STATUSES = frozenset({200, 400, 404, 500, 503})


class ProcessorError(Exception):
    """A failure with a status code and a message meant for the caller.

    The message is complete on its own (it names the offending key, input or version); edges
    send it unchanged.
    """

    code: StatusCode = StatusCode.INTERNAL

    def __init__(self, message: str, code: StatusCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)

    @property
    def edge(self) -> EdgeStatus:
        return STATUS_TABLE[self.code]


class InvalidArgument(ProcessorError):
    code = StatusCode.INVALID_ARGUMENT


class ConfigError(InvalidArgument):
    """A model or deployment config is wrong; the message names the key."""


class NotFound(ProcessorError):
    code = StatusCode.NOT_FOUND


class FailedPrecondition(ProcessorError):
    code = StatusCode.FAILED_PRECONDITION


class SignatureNotFound(FailedPrecondition):
    """A call names a signature the served model does not have (TF Serving's Predict wording);
    ``name`` is the signature asked for, so an edge whose TF Serving API words it otherwise
    (REST, Classify, Regress: INVALID_ARGUMENT) can say it its way."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class ResourceExhausted(ProcessorError):
    code = StatusCode.RESOURCE_EXHAUSTED


class PayloadTooLarge(ResourceExhausted):
    """The request is over a configured size limit (HTTP 413)."""


class Internal(ProcessorError):
    code = StatusCode.INTERNAL


class Unavailable(ProcessorError):
    code = StatusCode.UNAVAILABLE


class DeadlineExceeded(ProcessorError):
    code = StatusCode.DEADLINE_EXCEEDED


def as_processor_error(exc: BaseException) -> ProcessorError:
    """Return ``exc`` itself if it is a :class:`ProcessorError`, else wrap it as INTERNAL.

    The wrapper's ``__cause__`` is ``exc``: its type and traceback stay with it (raise it
    ``from exc``, never ``from None``), so the edge can log where the failure really happened.
    """
    if isinstance(exc, ProcessorError):
        return exc
    err = Internal(f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc  # also sets __suppress_context__
    return err


def result_or_error(fn, *args):
    """``fn(*args)``, or the exception it raised as :func:`as_processor_error` gives it: for calls
    that answer many requests, one result or error each."""
    try:
        return fn(*args)
    except Exception as exc:
        return as_processor_error(exc)


_LOGGED = "_processor_edge_logged"  # set on an exception whose traceback an edge has logged


def edge_error(exc: BaseException, edge: str, logger: logging.Logger) -> ProcessorError:
    """Convert the exception that failed a request into the :class:`ProcessorError` to answer
    with, logging it once. Every edge (``"http"``, ``"grpc"``, ``"c_abi"``) calls this exactly
    once per failed request, where it turns the failure into its transport's status
    (``edge_error(exc, edge, log).edge`` is the :data:`STATUS_TABLE` row to send).

    * The result is :func:`as_processor_error`'s: ``exc`` itself if it is a ProcessorError,
      else an :class:`Internal` whose ``__cause__`` is ``exc``.
    * INTERNAL (a bug or an engine failure): one ERROR record on ``logger`` with ``exc``'s
      traceback (``exc_info``; a wrapper's record shows its cause's traceback first, as
      Python chains them), the edge name and the message (``extra``: ``edge``, ``status``).
      The original exception (the end of the ``__cause__`` chain) is marked, so the same
      failure reaching an edge again (one engine failure shared by the requests of a merged
      batch, each wrapped on its own; a cached failure) is logged at DEBUG only.
    * Every other code is the caller's problem or an expected condition (4xx-class,
      UNAVAILABLE, DEADLINE_EXCEEDED): it is answered, not logged above DEBUG.

    * Then ``exc`` lets go of its frames (:func:`drop_tracebacks`): the answer needs only the
      message, and a failed request's frames hold its body.

    Never raises.
    """
    err = as_processor_error(exc)
    if err.code != StatusCode.INTERNAL:
        logger.debug("%s: %s: %s", edge, err.code.name, err.message,
                     extra={"edge": edge, "status": err.code.name})
        drop_tracebacks(exc)
        return err
    origin = exc  # the original exception, the end of the __cause__ chain: what gets marked
    seen = {id(origin)}
    while origin.__cause__ is not None and id(origin.__cause__) not in seen:
        origin = origin.__cause__
        seen.add(id(origin))
    try:
        first = not getattr(origin, _LOGGED, False)
        setattr(origin, _LOGGED, True)
    except Exception:  # an exception type that takes no attributes: log it every time
        first = True
    extra = {"edge": edge, "status": err.code.name}
    if first:
        logger.error("%s: internal error: %s", edge, err.message,
                     exc_info=(type(exc), exc, exc.__traceback__), extra=extra)
    else:
        logger.debug("%s: internal error (traceback logged before): %s", edge, err.message, extra=extra)
    drop_tracebacks(exc)
    return err


def drop_tracebacks(exc: BaseException) -> None:
    """Let go of the frames ``exc`` holds: the traceback of it and of every exception it chains
    (``__cause__``, ``__context__``) is dropped.

    Why: a failed request's frames hold its body and everything decoded from it, and an
    exception that one of those frames can reach again (the future it was awaited through, a
    local) closes a reference cycle frame -> exception -> traceback -> frame. Only a full
    garbage collection frees such a cycle, which the server makes rare
    (:func:`server.runtime.tune_gc`): every refused request held its body, ~1 MiB per 1 MiB
    request, until then. Call it once the exception has been logged; ``exc`` stays usable
    (type, message, chain), only its tracebacks are gone.
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack += (e.__cause__, e.__context__)
