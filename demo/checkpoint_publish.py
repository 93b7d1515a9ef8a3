"""Publish a full checkpoint into a run directory so that readers never see half of it.

The checkpoint is written into a hidden temporary directory inside the run directory (same
file system, so renames are atomic), then moved in: the ``.data-*`` shards first, the
``.index`` last. A reader that lists ``model.ckpt-<step>.index`` therefore only finds complete
checkpoints. Last, the ``checkpoint`` state file is rewritten atomically (relative paths, all
complete checkpoints oldest first, the highest step as ``model_checkpoint_path``).

Not safe for two writers on one run directory at the same time. Does not import TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from demo.layout import CHECKPOINT_STATE_NAME, checkpoint_prefix, list_checkpoint_steps

_TMP_PREFIX = ".tmp-ckpt-"


def publish_checkpoint(run_dir: Path, step: int, write: Callable[[str], object]) -> Path:
    """Write the full checkpoint for ``step`` with ``write`` and publish it in ``run_dir``.

    Args:
        run_dir: an existing run directory (``<checkpoint_dir>/<run>``).
        step: the global step; the checkpoint becomes ``run_dir/model.ckpt-<step>``.
        write: called once with a temporary prefix (a string); must write exactly that
            checkpoint (``<prefix>.index`` and ``<prefix>.data-*``), e.g. ``Saver.save`` with
            ``write_meta_graph=False, write_state=False`` or ``tf.train.Checkpoint.write``.

    Returns:
        The published prefix.

    Raises:
        FileExistsError: a checkpoint for ``step`` is already published.
        RuntimeError: ``write`` produced no ``.index`` or no ``.data-*`` file.
    """
    run_dir = Path(run_dir).resolve()
    final = checkpoint_prefix(run_dir, step)
    final_index = final.with_name(final.name + ".index")
    if final_index.exists():
        raise FileExistsError(f"checkpoint already published: {final}")
    tmp_dir = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=run_dir))
    try:
        write(str(tmp_dir / final.name))
        index = tmp_dir / final_index.name
        shards = sorted(tmp_dir.glob(f"{final.name}.data-*"))
        if not index.is_file() or not shards:
            raise RuntimeError(f"checkpoint writer left no complete checkpoint in {tmp_dir}")
        for shard in shards:
            os.replace(shard, run_dir / shard.name)
        os.replace(index, final_index)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    _write_state(run_dir)
    return final


def _write_state(run_dir: Path) -> None:
    """Rewrite ``run_dir/checkpoint`` (a text ``CheckpointState``) atomically: every complete
    checkpoint oldest first, the newest as ``model_checkpoint_path``, paths relative to ``run_dir``."""
    names = [checkpoint_prefix(run_dir, s).name for s in list_checkpoint_steps(run_dir)]
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    tmp = run_dir / f"{_TMP_PREFIX}state"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / CHECKPOINT_STATE_NAME)
