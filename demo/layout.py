"""On-disk layout of a demo model directory, and the :class:`ModelPaths` that describes one.

::

    <out_dir>/
      savedmodel/saved_model.pb, variables/     graph + signatures (+ initial parameters)
      checkpoints/                              checkpoint_dir: the parent that holds runs
        run_1/                                  the only run a demo build writes
          checkpoint                            TF checkpoint state (relative paths)
          model.ckpt-<step>.index|data-*        full checkpoints; highest step = newest
      model_card.json                           written last: its presence means "complete"

This module does not import TensorFlow.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAVEDMODEL_DIRNAME = "savedmodel"
CHECKPOINTS_DIRNAME = "checkpoints"
RUN_DIRNAME = "run_1"
CHECKPOINT_BASENAME = "model.ckpt"
MODEL_CARD_NAME = "model_card.json"
# Values of the model card's "model" key.
CTR_MODEL_NAME = "ctr_wide_deep"
TOY_MODEL_NAME = "toy"

_INDEX_RE = re.compile(re.escape(CHECKPOINT_BASENAME) + r"-(\d+)\.index")


@dataclass(frozen=True)
class ModelPaths:
    """Where a built demo model lies.

    Attributes:
        savedmodel_dir: directory holding ``saved_model.pb`` (the ``savedmodel_dir`` key).
        checkpoint_dir: parent directory of the checkpoint runs (the ``checkpoint_dir`` key).
        run_dir: the run directory inside ``checkpoint_dir`` that holds the checkpoints.
        checkpoint_prefixes: full checkpoint prefixes (``run_dir/model.ckpt-<step>``), oldest
            first; the last one is the version a server must serve.
        steps: the global step of each prefix, same order.
    """

    savedmodel_dir: Path
    checkpoint_dir: Path
    run_dir: Path
    checkpoint_prefixes: list[Path]
    steps: list[int]

    @property
    def latest_checkpoint_prefix(self) -> Path:
        """The newest full checkpoint prefix (highest step)."""
        return self.checkpoint_prefixes[-1]

    @property
    def out_dir(self) -> Path:
        """The model directory that holds ``savedmodel/`` and ``checkpoints/``."""
        return self.savedmodel_dir.parent


def checkpoint_prefix(run_dir: Path, step: int) -> Path:
    """The prefix of the full checkpoint for ``step`` inside ``run_dir``."""
    return run_dir / f"{CHECKPOINT_BASENAME}-{step}"


def list_checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete full checkpoints in ``run_dir`` (those with an ``.index``), ascending."""
    return sorted(
        int(m.group(1))
        for m in (_INDEX_RE.fullmatch(p.name) for p in Path(run_dir).glob("*.index"))
        if m is not None
    )


def read_model_paths(out_dir: Path) -> ModelPaths:
    """Describe the model already built in ``out_dir`` by listing its complete checkpoints.

    Paths in the result are absolute.

    A checkpoint counts once its ``.index`` file exists (the index is published last).

    Raises:
        FileNotFoundError: ``out_dir`` holds no SavedModel or no complete checkpoint.
    """
    out_dir = Path(out_dir).resolve()
    savedmodel_dir = out_dir / SAVEDMODEL_DIRNAME
    if not (savedmodel_dir / "saved_model.pb").is_file():
        raise FileNotFoundError(f"no SavedModel in {savedmodel_dir}")
    checkpoint_dir = out_dir / CHECKPOINTS_DIRNAME
    run_dir = checkpoint_dir / RUN_DIRNAME
    steps = list_checkpoint_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint in {run_dir}")
    return ModelPaths(
        savedmodel_dir=savedmodel_dir,
        checkpoint_dir=checkpoint_dir,
        run_dir=run_dir,
        checkpoint_prefixes=[checkpoint_prefix(run_dir, s) for s in steps],
        steps=steps,
    )


def read_model_card(out_dir: Path) -> dict[str, Any] | None:
    """The parsed ``model_card.json`` of ``out_dir``, or ``None`` when there is none."""
    path = Path(out_dir) / MODEL_CARD_NAME
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def write_model_card(out_dir: Path, card: dict[str, Any]) -> Path:
    """Write ``card`` as ``out_dir/model_card.json`` atomically (temp file, then rename)."""
    path = Path(out_dir) / MODEL_CARD_NAME
    tmp = path.with_name(f".{MODEL_CARD_NAME}.tmp")
    tmp.write_text(json.dumps(card, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def prepare_out_dir(out_dir: Path) -> ModelPaths:
    """Create ``out_dir`` for a fresh build and return its (still empty) :class:`ModelPaths`.

    Creates ``checkpoints/run_1/``; ``savedmodel/`` is left for the SavedModel writer, which
    refuses an existing directory.

    Raises:
        FileExistsError: ``out_dir`` already holds a SavedModel, checkpoints or a model card.
    """
    out_dir = Path(out_dir)
    owned = [out_dir / SAVEDMODEL_DIRNAME, out_dir / CHECKPOINTS_DIRNAME, out_dir / MODEL_CARD_NAME]
    existing = [str(p) for p in owned if p.exists()]
    if existing:
        raise FileExistsError(f"model directory is not empty: {', '.join(existing)}")
    run_dir = out_dir / CHECKPOINTS_DIRNAME / RUN_DIRNAME
    run_dir.mkdir(parents=True)
    return ModelPaths(
        savedmodel_dir=out_dir / SAVEDMODEL_DIRNAME,
        checkpoint_dir=out_dir / CHECKPOINTS_DIRNAME,
        run_dir=run_dir,
        checkpoint_prefixes=[],
        steps=[],
    )


def clear_model(out_dir: Path) -> None:
    """Remove a (possibly partial) build from ``out_dir``: the model card first, so the
    directory stops counting as complete, then ``savedmodel/`` and ``checkpoints/``.
    Other files in ``out_dir`` are kept. Readers of the old model must be gone.
    """
    out_dir = Path(out_dir)
    (out_dir / MODEL_CARD_NAME).unlink(missing_ok=True)
    for name in (SAVEDMODEL_DIRNAME, CHECKPOINTS_DIRNAME):
        shutil.rmtree(out_dir / name, ignore_errors=True)
