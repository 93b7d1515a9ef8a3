"""WireCodec: one signature's request decoder and response encoder on the request path.

The native extension (:mod:`processor.native`) reads PredictRequest bytes straight into numpy
arrays and writes PredictResponse bytes, without the GIL for large messages. Whatever it does
not take (every invalid request, rare wire forms, half / bfloat16 / complex inputs, outputs of
other dtypes) goes to the Python reference, :mod:`processor.codec`, so results and error
messages are the reference's by construction; the tests check the two agree byte for byte.

``fingerprinted``: string inputs the engine takes as TensorFlow ``Fingerprint64`` values (the
ONNX Runtime backend's hashed inputs). The native decoder delivers those as uint64 arrays,
hashed without the GIL; the reference delivers bytes arrays, which the engine hashes itself.
Engines accept both forms.

Immutable after construction; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from . import codec, native
from .codec import DecodedRequest
from .signature import Signature


class WireCodec:
    """See the module doc."""

    def __init__(self, signature: Signature, fingerprinted: Iterable[str] = ()) -> None:
        self.signature = signature
        self.fingerprinted = frozenset(fingerprinted)
        self._native = native.MODULE
        self._plan = None
        if self._native is None:
            native.status()  # logs, once per process, that serving runs the slower reference
        else:
            self._plan = self._native.Plan(
                [(s.alias, s.name, s.dtype, s.shape, s.alias in self.fingerprinted)
                 for s in signature.inputs.values()],
                [(s.alias, s.name) for s in signature.outputs.values()])

    def decode(self, data: bytes | memoryview) -> tuple[dict[str, np.ndarray], tuple[str, ...], tuple[str, ...]]:
        """Serialized PredictRequest -> (feeds by input alias, response keys, output aliases).

        The keys and aliases are parallel: fetch output ``aliases[i]`` and answer it as
        ``keys[i]``. Raises InvalidArgument exactly as the reference does.
        """
        if self._plan is not None:
            fast = self._native.decode(self._plan, data)
            if fast is not None:
                return fast
        return split_fetches(codec.decode_request(data, self.signature))

    @property
    def native_plan(self):
        """The compiled signature the native extension decodes with (None without it)."""
        return self._plan

    def describe(self) -> dict:
        """For model info: native or reference, and the inputs hashed while decoding."""
        return {**native.status(), "fingerprinted_inputs": sorted(self.fingerprinted)}

    def encode(self, keys: tuple[str, ...], arrays: list[np.ndarray]) -> bytes:
        """Response keys and their arrays -> serialized PredictResponse (deterministic bytes)."""
        if self._native is not None:
            data = self._native.encode(keys, arrays)
            if data is not None:
                return data
        return codec.encode_response(dict(zip(keys, arrays)))


def split_fetches(decoded: DecodedRequest) -> tuple[dict[str, np.ndarray], tuple[str, ...], tuple[str, ...]]:
    """A reference DecodedRequest in :meth:`WireCodec.decode`'s form."""
    return (decoded.feeds, tuple([key for key, _ in decoded.fetches]),
            tuple([alias for _, alias in decoded.fetches]))
