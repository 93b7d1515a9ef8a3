"""Request bytes parsed inside a gRPC handler, not by grpcio.

grpcio's ``request_deserializer`` runs before the handler: bytes that are not the method's
message end as INTERNAL ("Exception deserializing request!") with a traceback in the log, and the
call is neither counted nor access-logged. Methods registered with :func:`parsed` get the bytes
(no deserializer) and parse them here; a message that does not parse is answered through the
handlers' ``_call`` (request id, drain gate, metrics, the one error mapping) as INVALID_ARGUMENT.
Thread-safe (no state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from processor.echo import shorten
from processor.errors import InvalidArgument

Call = Callable[[str, str, grpc.ServicerContext, Callable[[], Any]], Any]


def parsed(handler: Callable[[Any, grpc.ServicerContext], Any], request_type: Any, call: Call,
           api: str) -> Callable[[bytes, grpc.ServicerContext], Any]:
    """``handler(request, context)`` as a handler of the request's bytes (see the module doc);
    ``api``: the metrics and access-log name a refused message is counted under."""
    def handle(data: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = request_type.FromString(data)
        except (DecodeError, ValueError, RecursionError) as exc:
            problem = shorten(str(exc), 120)

            def refuse() -> Any:
                raise InvalidArgument(f"the request is not a serialized {request_type.DESCRIPTOR.full_name} "
                                      f"({len(data)} bytes): {problem}")
            return call(api, "", context, refuse)
        return handler(request, context)
    return handle


def unary(handler: Callable[[Any, grpc.ServicerContext], Any], request_type: Any, response_type: Any,
          call: Call, api: str) -> grpc.RpcMethodHandler:
    """A unary method whose request is parsed by :func:`parsed`."""
    return grpc.unary_unary_rpc_method_handler(parsed(handler, request_type, call, api),
                                               response_serializer=response_type.SerializeToString)
