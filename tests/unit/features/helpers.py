"""Helpers for the feature store tests: copies of the demo CTR model, hand-written full and delta
checkpoints (plain and EmbeddingVariable format), processors and their predictions."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from processor import codec
from sp_checks import wait_for  # noqa: F401  (re-exported for the feature-store tests)

ID_TABLES = [f"embeddings/C{i}" for i in range(1, 21)]
TOKEN_TABLES = [f"embeddings/C{i}" for i in range(21, 27)]


def copy_model(paths, dst: Path):
    """A private copy of a built demo model (so a test may publish checkpoints into it)."""
    from demo.layout import read_model_paths

    shutil.copytree(paths.out_dir, dst)
    return read_model_paths(dst)


def read_all(prefix) -> dict[str, np.ndarray]:
    from processor.checkpoint.tensor_file import read_tensors

    return read_tensors(str(prefix))


def publish_full(run_dir: Path, step: int, tensors: dict[str, np.ndarray]) -> Path:
    from demo.trainer.publish import publish_checkpoint, update_state
    from processor.checkpoint.tensor_file import write_tensors

    prefix = publish_checkpoint(run_dir, "model.ckpt", step, lambda tmp: write_tensors(tmp, tensors))
    update_state(run_dir, "model.ckpt")
    return prefix


def publish_delta(run_dir: Path, step: int, tensors: dict[str, np.ndarray]) -> Path:
    from demo.trainer.publish import publish_checkpoint
    from processor.checkpoint.tensor_file import write_tensors

    return publish_checkpoint(run_dir / ".incremental_checkpoint", "incremental_model.ckpt", step,
                              lambda tmp: write_tensors(tmp, tensors))


def row_delta(full: dict[str, np.ndarray], step: int, seed: int = 0):
    """A delta in this repo's format (row ids) changing a few rows of C1 and C21 and one dense
    variable; returns (delta tensors, the full tensors with the delta applied)."""
    rng = np.random.default_rng(seed)
    after = {k: v.copy() for k, v in full.items()}
    delta: dict[str, np.ndarray] = {}
    for table in ("embeddings/C1", "embeddings/C21"):
        rows = np.unique(rng.integers(0, full[table].shape[0], 40)).astype(np.int64)
        values = rng.standard_normal((len(rows), full[table].shape[1])).astype(np.float32)
        after[table][rows] = values
        delta.update({f"{table}-keys": rows, f"{table}-values": values,
                      f"{table}-freqs": np.ones(len(rows), np.int64),
                      f"{table}-versions": np.full(len(rows), step, np.int64)})
    after["mlp/output/bias"] = full["mlp/output/bias"] + 0.25
    delta["mlp/output/bias"] = after["mlp/output/bias"]
    for name, value in full.items():
        if not name.startswith("embeddings/") and name not in delta:
            delta[name] = value
    return delta, after


def served(processor, feeds) -> dict[str, np.ndarray]:
    status, body = processor.process(codec.encode_request(feeds))
    assert status == 200, body
    return codec.decode_response(body)


def label(processor) -> str:
    return processor.model_info()["version"]["label"]


def store_tables(processor):
    """The serving group's VersionTables."""
    return processor.manager._current.group.backend._embedding.tables
