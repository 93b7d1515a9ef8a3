"""DataPlane: the one use-case layer every front-end calls (HTTP, gRPC, the C ABI).

``decode -> acquire the serving group -> run on a lane -> encode``. Every failure is a
:class:`~processor.errors.ProcessorError`; front-ends map it once. Thread-safe: any number of
threads may call any method at once.

Timeline tracing: a model with a :class:`~processor.tracing.Tracer` has each predict request
counted; the requests it picks run on a traced path that times every stage and asks the engine
for a full per-op trace. Untraced requests pay one truthiness check of a dict that is empty
unless some model still has traces to take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import codec
from .errors import NotFound, as_processor_error
from .manager.model_manager import ModelManager
from .proto import predict_pb2
from .signature import Signature
from .tracing import Tracer, TraceRecorder
from .tracing.tracer import now_us


class DataPlane:
    """Routes requests to models by name. See the module doc."""

    def __init__(self, models: Mapping[str, ModelManager],
                 tracers: Mapping[str, Tracer | None] | None = None) -> None:
        self._models = dict(models)
        # Only tracers with traces left; emptied as they finish, so the hot path stays one check.
        self._tracers = {name: t for name, t in (tracers or {}).items() if t is not None and not t.done}

    @property
    def model_names(self) -> list[str]:
        return list(self._models)

    def manager(self, name: str) -> ModelManager:
        try:
            return self._models[name]
        except KeyError:
            raise NotFound(f"unknown model {name!r}; serving {sorted(self._models)}") from None

    def predict(self, name: str, data: bytes | memoryview) -> bytes:
        """Serialized PredictRequest in, serialized PredictResponse out.

        ``data`` may be a memoryview of the caller's buffer (the C ABI's): it is read during the
        call only, never kept. The untraced path is the request path's hot loop: one handle
        acquire and the group's ``serve`` (the engine's native whole-request path, or the native
        codec around the engine call).
        """
        if self._tracers:
            recorder = self._begin_trace(name)
            if recorder is not None:
                return self._traced(name, recorder, lambda: codec.parse_request(data), codec.decode_message)
        model = self._models.get(name)
        if model is None:
            self.manager(name)  # raises NotFound with the list of models
        handle = model.acquire_handle()
        try:
            return handle.group.serve(data)
        except Exception as exc:
            raise as_processor_error(exc) from None
        finally:
            handle.release()

    def predict_message(self, name: str, request: predict_pb2.PredictRequest) -> bytes:
        """A parsed PredictRequest in, serialized PredictResponse out."""
        if self._tracers:
            recorder = self._begin_trace(name)
            if recorder is not None:
                return self._traced(name, recorder, lambda: request, codec.decode_message)
        return self._predict_message(name, request)

    def _predict_message(self, name: str, request: predict_pb2.PredictRequest) -> bytes:
        with self.manager(name).acquire() as group:
            decoded = codec.decode_message(request, group.signature)
            outputs = self._run(group, decoded)
        return codec.encode_response(outputs)

    def predict_arrays(self, name: str, inputs: Mapping[str, np.ndarray],
                       output_filter: list[str] | None = None) -> dict[str, np.ndarray]:
        """numpy inputs (keyed by alias or tensor name) in, numpy outputs out.

        For front-ends that parse their own wire format (JSON); inputs are checked against the
        signature exactly as protobuf requests are.
        """
        def decode(parsed, signature):
            return codec.decode_arrays(inputs, output_filter, signature)

        if self._tracers:
            recorder = self._begin_trace(name)
            if recorder is not None:
                return self._traced(name, recorder, lambda: None, decode, encode=False)
        with self.manager(name).acquire() as group:
            return self._run(group, decode(None, group.signature))

    @staticmethod
    def _run(group, decoded: codec.DecodedRequest) -> dict[str, np.ndarray]:
        aliases = tuple(alias for _, alias in decoded.fetches)
        try:
            arrays = group.run(decoded.feeds, aliases)
        except Exception as exc:
            raise as_processor_error(exc) from None
        return {key: array for (key, _), array in zip(decoded.fetches, arrays)}

    # --- timeline tracing -------------------------------------------------------------------

    def _begin_trace(self, name: str) -> TraceRecorder | None:
        """Count the request with the model's tracer; a recorder if it is to be traced."""
        tracer = self._tracers.get(name)
        if tracer is None:
            return None
        recorder = tracer.begin()
        if tracer.done:
            self._tracers.pop(name, None)  # no traces left: later requests skip tracing entirely
        return recorder

    def _traced(self, name: str, rec: TraceRecorder, parse: Callable[[], Any],
                decode: Callable[[Any, Signature], codec.DecodedRequest], encode: bool = True) -> Any:
        """One request on the traced path: same results and errors, every stage timed.

        ``parse`` reads the transport's payload, ``decode`` checks it against the signature.
        The trace is submitted (never raising) whether the request succeeds or fails.
        """
        try:
            with rec.stage("request"):
                with rec.stage("parse"):
                    parsed = parse()
                with contextlib.ExitStack() as stack:
                    with rec.stage("acquire"):
                        group = stack.enter_context(self.manager(name).acquire())
                    with rec.stage("decode"):
                        decoded = decode(parsed, group.signature)
                    outputs = self._run_traced(group, decoded, rec)
                if not encode:
                    return outputs
                with rec.stage("encode"):
                    return codec.encode_response(outputs)
        except Exception as exc:
            rec.error = str(exc)
            raise
        finally:
            rec.tracer.submit(rec)

    @staticmethod
    def _run_traced(group, decoded: codec.DecodedRequest, rec: TraceRecorder) -> dict[str, np.ndarray]:
        aliases = tuple(alias for _, alias in decoded.fetches)
        with rec.stage("run") as stage:
            try:
                rec.lane, arrays, rec.engine = group.run_traced(decoded.feeds, aliases)
            except Exception as exc:
                raise as_processor_error(exc) from None
            finally:
                rec.run_window = (stage.start, now_us())
        return {key: array for (key, _), array in zip(decoded.fetches, arrays)}

    def signature(self, name: str) -> dict[str, Any]:
        """DeepRec's signature description of the served version."""
        with self.manager(name).acquire() as group:
            return group.signature.describe()

    def model_info(self, name: str) -> dict[str, Any]:
        return self.manager(name).info()
