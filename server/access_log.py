"""The access log: one line per answered request, written off the request's thread.

A formatted log line costs more CPU than a batch-1 request on the native engine (a LogRecord,
the caller lookup, the JSON formatter, a write to stderr: ~60-80 us against ~20-50 us), so the
request thread only appends a tuple of what it knows to a bounded deque; a writer thread drains
it a few times a second and emits its lines through ``logging`` (logger ``server.access``, the
configured handler and format, the request's id); where that is the server's own JSON stream
handler (:func:`server.logs.configure_logging`), a drain formats its lines directly, the same
JSON, and writes them with one write (a LogRecord, the handler's lock and a write per line cost
~100 us of CPU a request under load). Successful requests are logged when
``access_log`` is on, a ``sample_rate`` share of them; failed requests are always logged, and at
once, on the caller's thread (they are rare, and their line must not be lost or late).

When the writer falls behind by ``max_pending`` lines, further successful lines are dropped and
counted; the writer logs the count once per drain. Nothing waits on the writer. :meth:`close`
writes what is queued.

Thread-safe: :meth:`ok` and :meth:`error` may be called from any thread (the event loop, the
model pools, gRPC's threads); ``deque.append`` / ``popleft`` are atomic.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque

from .logs import JsonFormatter

log = logging.getLogger("server.access")

_FLUSH_SECONDS = 0.2


class AccessLog:
    """See the module doc. ``enabled``: log successful requests; ``sample_rate``: the share of
    them logged (1.0: all)."""

    def __init__(self, enabled: bool = True, sample_rate: float = 1.0, max_pending: int = 100_000) -> None:
        self.sample_rate = sample_rate if enabled else 0.0
        self.max_pending = max_pending
        self.dropped = 0
        self._pending: deque[tuple] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def ok(self, protocol: str, api: str, model: str, version: str, seconds: float, request_id: str) -> None:
        """A successful request: queued for the writer when sampled (never blocks, never raises)."""
        rate = self.sample_rate
        if rate <= 0.0 or (rate < 1.0 and random.random() >= rate):
            return
        if len(self._pending) >= self.max_pending:
            self.dropped += 1
            return
        self._pending.append((protocol, api, model, version, seconds, request_id))
        if self._writer is None:
            self._start()

    @staticmethod
    def error(protocol: str, api: str, model: str, label: str, version: str, code: str, message: str,
              seconds: float, request_id: str) -> None:
        """A failed request, written now (``model`` is the name as the client sent it, cut;
        ``label`` the metrics label: the model, or ``_unknown``)."""
        log.warning("%s %s %s -> %s: %s", protocol, api, model, code, message,
                    extra=fields(label, version, protocol, api, code, seconds, request_id))

    def close(self) -> None:
        """Write what is queued and stop the writer. Idempotent."""
        self._closed = True
        self._wake.set()
        writer = self._writer
        if writer is not None:
            writer.join(10)
        self._drain()

    # --- the writer -------------------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._writer is None and not self._closed:
                self._writer = threading.Thread(target=self._run, name="sp-access-log", daemon=True)
                self._writer.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(_FLUSH_SECONDS)
            self._drain()

    def _drain(self) -> None:
        dropped, self.dropped = self.dropped, 0
        if dropped:  # said once per drain, not per line
            log.warning("access log: %d line(s) dropped, the writer fell %d lines behind",
                        dropped, self.max_pending)
        pending = self._pending
        lines = []
        while pending:
            try:
                lines.append(pending.popleft())
            except IndexError:  # another drain (close) took the last one
                break
        if not lines or not log.isEnabledFor(logging.INFO):
            return
        sink = _json_stream_sink()
        if sink is not None:  # the server's own JSON handler: the lines formatted and written at once
            handler, formatter = sink
            text = formatter.access_lines(time.time(), lines)
            handler.acquire()
            try:
                handler.stream.write(text)
                handler.flush()
            except Exception:  # noqa: BLE001 - as logging does: a failing stream never reaches requests
                handler.handleError(logging.makeLogRecord({"msg": "access log write failed"}))
            finally:
                handler.release()
            return
        for protocol, api, model, version, seconds, request_id in lines:
            log.info("%s %s %s -> OK", protocol, api, model,
                     extra=fields(model, version, protocol, api, "OK", seconds, request_id))


def _json_stream_sink() -> tuple[logging.StreamHandler, JsonFormatter] | None:
    """The one handler an access-log line reaches when it is the server's own (a stream handler
    with the JSON formatter on the root logger, no filters on the way, INFO let through), else
    None: then lines go through ``logging`` one by one (any other configuration)."""
    logger: logging.Logger | None = log
    while logger is not None:
        if logger.filters or logger.disabled:
            return None
        if logger.handlers:
            break
        logger = logger.parent if logger.propagate else None
    if logger is None or logger.parent is not None or len(logger.handlers) != 1:
        return None
    (handler,) = logger.handlers
    formatter = handler.formatter
    if (type(handler) is not logging.StreamHandler or type(formatter) is not JsonFormatter
            or handler.filters or handler.level > logging.INFO):
        return None
    return handler, formatter


def fields(model: str, version: str, protocol: str, api: str, code: str, seconds: float,
           request_id: str) -> dict:
    """The structured fields of an access-log line."""
    return {"model": model, "version": version, "protocol": protocol, "api": api, "code": code,
            "ms": round(seconds * 1000, 3), "request_id": request_id}
