"""Small DLRM-like ONNX models (demo/dlrm_onnx.py) built for tests: one directory per name, each
of its own seed, so that their answers differ."""

from pathlib import Path

from demo import dlrm_onnx


def build_models(base: Path, names=("a", "b")) -> dict[str, Path]:
    """``base/<name>/model.onnx`` for each name (seeds 1, 2, ...); name -> its directory."""
    out = {}
    for seed, name in enumerate(names, start=1):
        dlrm_onnx.build(base / name / "model.onnx", rows=2000, dim=8, seed=seed)
        out[name] = base / name
    return out
