"""A DLRM-like CTR model written directly as ONNX (no TensorFlow): the ``.onnx`` source case.

Inputs ``dense`` float32 ``[batch, 13]`` and ``sparse`` int64 ``[batch, 26]`` (raw ids, one per
categorical feature); 26 embedding tables of ``rows`` x ``dim`` stacked in one parameter (each
feature's ids taken modulo ``rows`` and offset to its table), a bottom MLP on the dense features,
the embeddings and the bottom output concatenated, a top MLP and a sigmoid: output ``prob``
``[batch, 1]``. Weights are seeded random numbers; the model exists to be served and timed.

Only ``onnx`` and numpy are needed, so a GPU machine without TensorFlow can build it too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

DENSE, SPARSE = 13, 26


def build(path: Path, rows: int = 50_000, dim: int = 16, seed: int = 0) -> Path:
    """Write the model to ``path`` (a ``.onnx`` file, weights inside); returns ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        scale = 1.0 / np.sqrt(shape[0])
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        numpy_helper.from_array((rng.standard_normal((SPARSE * rows, dim)) * 0.05).astype(np.float32), "tables"),
        numpy_helper.from_array(np.array([rows], np.int64), "rows"),
        numpy_helper.from_array((np.arange(SPARSE, dtype=np.int64) * rows).reshape(1, SPARSE), "offsets"),
        numpy_helper.from_array(np.array([-1, SPARSE * dim], np.int64), "flat_shape"),
        weight("bot_w0", DENSE, 64), numpy_helper.from_array(np.zeros(64, np.float32), "bot_b0"),
        weight("bot_w1", 64, dim), numpy_helper.from_array(np.zeros(dim, np.float32), "bot_b1"),
        weight("top_w0", (SPARSE + 1) * dim, 256), numpy_helper.from_array(np.zeros(256, np.float32), "top_b0"),
        weight("top_w1", 256, 64), numpy_helper.from_array(np.zeros(64, np.float32), "top_b1"),
        weight("top_w2", 64, 1), numpy_helper.from_array(np.zeros(1, np.float32), "top_b2"),
    ]
    nodes = [
        helper.make_node("Mod", ["sparse", "rows"], ["local_ids"], fmod=0),
        helper.make_node("Add", ["local_ids", "offsets"], ["ids"]),
        helper.make_node("Gather", ["tables", "ids"], ["emb"], axis=0),          # [B, 26, dim]
        helper.make_node("Reshape", ["emb", "flat_shape"], ["emb_flat"]),
        helper.make_node("Gemm", ["dense", "bot_w0", "bot_b0"], ["b0"]),
        helper.make_node("Relu", ["b0"], ["b0r"]),
        helper.make_node("Gemm", ["b0r", "bot_w1", "bot_b1"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["b1r"]),
        helper.make_node("Concat", ["b1r", "emb_flat"], ["x"], axis=1),
        helper.make_node("Gemm", ["x", "top_w0", "top_b0"], ["t0"]),
        helper.make_node("Relu", ["t0"], ["t0r"]),
        helper.make_node("Gemm", ["t0r", "top_w1", "top_b1"], ["t1"]),
        helper.make_node("Relu", ["t1"], ["t1r"]),
        helper.make_node("Gemm", ["t1r", "top_w2", "top_b2"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes, "dlrm_like",
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", DENSE]),
         helper.make_tensor_value_info("sparse", TensorProto.INT64, ["batch", SPARSE])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def inputs(batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs for ``batch`` rows, keyed by input name."""
    rng = np.random.default_rng(seed)
    return {"dense": rng.standard_normal((batch, DENSE)).astype(np.float32),
            "sparse": rng.integers(0, 2**40, (batch, SPARSE), dtype=np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write model.onnx into")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=16)
    args = parser.parse_args()
    print(build(args.out / "model.onnx", args.rows, args.dim))


if __name__ == "__main__":
    main()
