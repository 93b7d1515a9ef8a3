"""Read a SavedModel's signature back from ``saved_model.pb`` (for model cards and checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2


def describe_signature(savedmodel_dir: Path, signature_name: str = "serving_default") -> dict[str, Any]:
    """Describe one signature of the SavedModel in ``savedmodel_dir`` as plain JSON-able data.

    Returns:
        ``{"signature_name", "method_name", "inputs", "outputs"}`` where inputs and outputs map
        each alias to ``{"name": tensor name, "dtype": e.g. "float32", "shape": [-1, 13]}``
        (``-1`` for an unknown dimension).

    Raises:
        KeyError: the first MetaGraphDef has no such signature.
    """
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((Path(savedmodel_dir) / "saved_model.pb").read_bytes())
    signature = saved_model.meta_graphs[0].signature_def[signature_name]

    def tensors(infos: Any) -> dict[str, Any]:
        return {
            alias: {
                "name": info.name,
                "dtype": tf.dtypes.as_dtype(info.dtype).name,
                "shape": [d.size for d in info.tensor_shape.dim],
            }
            for alias, info in sorted(infos.items())
        }

    return {
        "signature_name": signature_name,
        "method_name": signature.method_name,
        "inputs": tensors(signature.inputs),
        "outputs": tensors(signature.outputs),
    }
