"""DataPlane: the one use-case layer every front-end calls (HTTP, gRPC, the C ABI).

``decode -> acquire the serving group -> run on a lane -> encode``. Every failure is a
:class:`~processor.errors.ProcessorError`; front-ends map it once. Thread-safe: any number of
threads may call any method at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import codec
from .errors import NotFound, as_processor_error
from .manager.model_manager import ModelManager
from .proto import predict_pb2


class DataPlane:
    """Routes requests to models by name. See the module doc."""

    def __init__(self, models: Mapping[str, ModelManager]) -> None:
        self._models = dict(models)

    @property
    def model_names(self) -> list[str]:
        return list(self._models)

    def manager(self, name: str) -> ModelManager:
        try:
            return self._models[name]
        except KeyError:
            raise NotFound(f"unknown model {name!r}; serving {sorted(self._models)}") from None

    def predict(self, name: str, data: bytes) -> bytes:
        """Serialized PredictRequest in, serialized PredictResponse out."""
        return self.predict_message(name, codec.parse_request(data))

    def predict_message(self, name: str, request: predict_pb2.PredictRequest) -> bytes:
        """A parsed PredictRequest in, serialized PredictResponse out."""
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
        request = predict_pb2.PredictRequest(output_filter=output_filter or [])
        try:
            for key, array in inputs.items():
                codec.fill_proto(request.inputs[key], np.asarray(array))
        except (TypeError, ValueError) as exc:
            raise codec.InvalidArgument(f"bad input value: {exc}") from None
        with self.manager(name).acquire() as group:
            decoded = codec.decode_message(request, group.signature)
            return self._run(group, decoded)

    @staticmethod
    def _run(group, decoded: codec.DecodedRequest) -> dict[str, np.ndarray]:
        aliases = tuple(alias for _, alias in decoded.fetches)
        try:
            arrays = group.run(decoded.feeds, aliases)
        except Exception as exc:
            raise as_processor_error(exc) from None
        return {key: array for (key, _), array in zip(decoded.fetches, arrays)}

    def signature(self, name: str) -> dict[str, Any]:
        """DeepRec's signature description of the served version."""
        with self.manager(name).acquire() as group:
            return group.signature.describe()

    def model_info(self, name: str) -> dict[str, Any]:
        return self.manager(name).info()
