"""Publish a checkpoint so that readers never see half of it.

The writer writes into a hidden temporary directory beside the destination (same file system,
so renames are atomic); the ``.data-*`` shards are moved in first and the ``.index`` last. A
reader that lists ``<name>-<step>.index`` (see :mod:`processor.store.checkpoint_layout`) finds
only complete checkpoints. Not safe for two writers on one directory at the same time.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

_TMP_PREFIX = ".tmp-ckpt-"


def publish_checkpoint(directory: Path, basename: str, step: int, write: Callable[[str], object]) -> Path:
    """Write ``<directory>/<basename>-<step>`` with ``write(tmp_prefix)`` and publish it.

    ``write`` must write exactly ``<tmp_prefix>.index`` and ``<tmp_prefix>.data-*`` (e.g.
    ``Saver.save(..., write_meta_graph=False, write_state=False)``). Returns the final prefix.
    Raises FileExistsError if that step is already published, RuntimeError if ``write`` left no
    complete checkpoint.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{basename}-{step}"
    final_index = final.with_name(final.name + ".index")
    if final_index.exists():
        raise FileExistsError(f"checkpoint already published: {final}")
    tmp_dir = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=directory))
    try:
        write(str(tmp_dir / final.name))
        index = tmp_dir / final_index.name
        shards = sorted(tmp_dir.glob(f"{final.name}.data-*"))
        if not index.is_file() or not shards:
            raise RuntimeError(f"checkpoint writer left no complete checkpoint in {tmp_dir}")
        for shard in shards:
            os.replace(shard, directory / shard.name)
        os.replace(index, final_index)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final


def update_state(run_dir: Path, basename: str) -> None:
    """Rewrite ``run_dir/checkpoint`` (a text ``CheckpointState``) atomically.

    Lists every published ``<basename>-<step>`` oldest first and names the highest step as
    ``model_checkpoint_path``, with paths relative to ``run_dir`` (TensorFlow's format).
    """
    run_dir = Path(run_dir)
    pattern = re.compile(re.escape(basename) + r"-(\d+)\.index$")
    steps = sorted(int(m.group(1)) for p in run_dir.iterdir() if (m := pattern.match(p.name)))
    if not steps:
        raise FileNotFoundError(f"no {basename}-<step> checkpoint in {run_dir}")
    names = [f"{basename}-{s}" for s in steps]
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    tmp = run_dir / f"{_TMP_PREFIX}state"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / "checkpoint")
