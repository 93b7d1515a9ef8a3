"""OTLP trace receivers for tests and benchmarks: OpenTelemetry's own protocol, over gRPC
(``opentelemetry.proto.collector.trace.v1.TraceService``) and over HTTP (``POST /v1/traces``,
protobuf), served in this process on a free loopback port.

``mode`` says how the receiver answers an export: ``ok`` takes it (and keeps its spans unless
``keep`` is False), ``refuse`` answers UNAVAILABLE / 503, ``hang`` never answers (until
:meth:`stop`): a collector that is down, refusing or stuck. :meth:`spans` flattens what was
received into :class:`ReceivedSpan` records; :meth:`wait_for` waits (bounded) until a
predicate over them holds.

    .venv/bin/python -m tools.otlp_receiver --protocol grpc --mode ok   # prints its port, discards

Thread-safe: exports arrive on the receivers' own threads.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("ok", "refuse", "hang")


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids in hex, its attributes and its resource's as plain values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


def flatten(request) -> list[ReceivedSpan]:
    """The spans of an ``ExportTraceServiceRequest``."""
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(), kind=s.kind, start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano, status_code=s.status.code, status_message=s.status.message,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                    resource=resource))
    return out


class _Receiver:
    """What both receivers share: the mode, the requests taken, waiting for spans."""

    def __init__(self, mode: str, keep: bool) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.keep = keep
        self.exports = 0  # export calls received, whatever the mode
        self._spans: list[ReceivedSpan] = []
        self._cond = threading.Condition()
        self._released = threading.Event()  # ends the hanging calls

    def _take(self, request) -> None:
        """An ``ExportTraceServiceRequest`` taken."""
        with self._cond:
            self.exports += 1
            if self.keep:
                self._spans.extend(flatten(request))
            self._cond.notify_all()

    def _counted(self) -> None:
        with self._cond:
            self.exports += 1
            self._cond.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        with self._cond:
            return list(self._spans)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans once ``predicate(spans)`` holds; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the receiver did not get the expected spans in {timeout} s; "
                                         f"it has {[s.name for s in self._spans]}")
                self._cond.wait(left)
            return list(self._spans)

    def wait_exports(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` export calls came (whatever the mode); AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.exports < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.exports} export calls in {timeout} s, expected {count}")
                self._cond.wait(left)


class GrpcReceiver(_Receiver):
    """OTLP/gRPC on ``127.0.0.1:port`` (``endpoint``: ``http://127.0.0.1:port``)."""

    def __init__(self, mode: str = "ok", keep: bool = True, port: int = 0) -> None:
        super().__init__(mode, keep)
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the service's method name
                if receiver.mode == "refuse":
                    receiver._counted()
                    context.abort(grpc.StatusCode.UNAVAILABLE, "refusing (test receiver)")
                if receiver.mode == "hang":
                    receiver._counted()
                    receiver._released.wait()
                    context.abort(grpc.StatusCode.UNAVAILABLE, "stopped")
                receiver._take(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(8, thread_name_prefix="otlp-grpc"))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server.start()

    def stop(self) -> None:
        self._released.set()
        self._server.stop(grace=None)


class HttpReceiver(_Receiver):
    """OTLP/HTTP (protobuf) on ``127.0.0.1:port``, ``POST /v1/traces`` (``endpoint``: the base
    URL)."""

    def __init__(self, mode: str = "ok", keep: bool = True, port: int = 0) -> None:
        super().__init__(mode, keep)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's hook name
                data = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self._answer(404, b"")
                elif receiver.mode == "refuse":
                    receiver._counted()
                    self._answer(503, b"")
                elif receiver.mode == "hang":
                    receiver._counted()
                    receiver._released.wait()
                    self.close_connection = True
                else:
                    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

                    receiver._take(pb.ExportTraceServiceRequest.FromString(data) if receiver.keep else None)
                    self._answer(200, pb.ExportTraceServiceResponse().SerializeToString())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # quiet
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="otlp-http")
        self._thread.start()

    def stop(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()


def start(protocol: str, mode: str = "ok", keep: bool = True, port: int = 0) -> GrpcReceiver | HttpReceiver:
    """A receiver of ``protocol`` (``grpc`` or ``http/protobuf``)."""
    cls = GrpcReceiver if protocol == "grpc" else HttpReceiver
    return cls(mode, keep, port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("grpc", "http/protobuf"), default="grpc")
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    receiver = start(args.protocol, args.mode, keep=False, port=args.port)
    print(receiver.port, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        receiver.stop()


if __name__ == "__main__":
    main()
