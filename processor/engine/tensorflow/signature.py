"""What a TensorFlow SavedModel serves: its MetaGraph tags and the Signature of a SignatureDef.

Shared by the TensorFlow backend (:mod:`.backend`) and the TensorFlow-to-ONNX conversion
(:mod:`processor.engine.onnx.from_tensorflow`), so that neither imports the other. Imports
nothing of TensorFlow: ``sig_def`` is a ``SignatureDef`` proto read by the caller.
"""

from __future__ import annotations

from ...signature import Signature, TensorSpec

SERVE_TAGS = ["serve"]


def signature_from_def(name: str, sig_def) -> Signature:
    """The :class:`~processor.signature.Signature` ``name`` of a ``SignatureDef`` proto."""
    def specs(infos) -> dict[str, TensorSpec]:
        out = {}
        for alias, info in sorted(infos.items()):  # map order varies by process
            shape = None if info.tensor_shape.unknown_rank else tuple(d.size for d in info.tensor_shape.dim)
            out[alias] = TensorSpec(alias, info.name, int(info.dtype), shape)
        return out

    return Signature(name, specs(sig_def.inputs), specs(sig_def.outputs), sig_def.method_name)
