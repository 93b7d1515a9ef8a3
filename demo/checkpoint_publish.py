"""Publish a full checkpoint into a run directory so that readers never see half of it.

The files are published atomically by :func:`demo.trainer.publish.publish_checkpoint`
(written aside, data shards moved in first, the index last). Last, the ``checkpoint`` state file
is rewritten atomically (relative paths, all complete checkpoints oldest first, the highest step
as ``model_checkpoint_path``).

Not safe for two writers on one run directory at the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from demo.layout import CHECKPOINT_BASENAME
from demo.trainer import publish


def publish_checkpoint(run_dir: Path, step: int, write: Callable[[str], object]) -> Path:
    """Write the full checkpoint for ``step`` with ``write``, publish it and update the state.

    ``write`` is called once with a temporary prefix and must write exactly that checkpoint
    (e.g. ``Saver.save`` with ``write_meta_graph=False, write_state=False``). Returns the
    published prefix; raises FileExistsError if ``step`` is already published.
    """
    final = publish.publish_checkpoint(Path(run_dir), CHECKPOINT_BASENAME, step, write)
    publish.update_state(Path(run_dir), CHECKPOINT_BASENAME)
    return final
