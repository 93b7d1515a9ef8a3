"""Signatures of ONNX models: to and from a cache entry's manifest, and read off an ONNX graph.

Functions only; thread-safe.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ...signature import Signature, TensorSpec

# ONNX TensorProto element type -> TF DataType number (the signature's dtype numbering).
_ONNX_TO_TF = {1: 1, 2: 4, 3: 6, 4: 17, 5: 5, 6: 3, 7: 9, 8: 7, 9: 10, 10: 19, 11: 2, 12: 22, 13: 23, 16: 14}


def signature_to_manifest(sig: Signature) -> dict[str, Any]:
    def specs(d: dict[str, TensorSpec]) -> dict[str, Any]:
        return {a: {"name": s.name, "dtype": s.dtype, "shape": None if s.shape is None else list(s.shape)}
                for a, s in d.items()}

    return {"name": sig.name, "method": sig.method, "inputs": specs(sig.inputs), "outputs": specs(sig.outputs)}


def signature_from_manifest(m: dict[str, Any]) -> Signature:
    def specs(d: dict[str, Any]) -> dict[str, TensorSpec]:
        return {a: TensorSpec(a, s["name"], s["dtype"], None if s["shape"] is None else tuple(s["shape"]))
                for a, s in d.items()}

    return Signature(m["name"], specs(m["inputs"]), specs(m["outputs"]), m["method"])


def signature_of_onnx(model, name: str) -> Signature:
    """The signature ``name`` of an ONNX graph: its inputs (less initializers) and outputs."""

    def specs(values) -> dict[str, TensorSpec]:
        out = {}
        for v in values:
            t = v.type.tensor_type
            dtype = _ONNX_TO_TF.get(t.elem_type)
            if dtype is None:
                raise ConfigError(f"ONNX model: tensor {v.name!r} has element type {t.elem_type}, "
                                  f"which the wire format cannot carry")
            shape = None if not t.HasField("shape") else tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            out[v.name] = TensorSpec(v.name, v.name, dtype, shape)
        return out

    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    return Signature(name, specs(inputs), specs(model.graph.output))
