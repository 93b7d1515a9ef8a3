"""ModelVersion: what to serve, as named by the checkpoint layout.

A value object (frozen, hashable, ordered) shared by the layout reader
(:mod:`processor.store.checkpoint_layout`, which builds them), the store (which materializes
them), the engines (which load them) and the manager (which serves them). It imports nothing
of the processor, so every layer may use it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class ModelVersion:
    """What to serve: a full checkpoint plus, optionally, deltas after it.

    ``full_step == -1`` means parameters come from the SavedModel's own variables.
    ``delta_step`` / ``delta_prefix`` name the last delta; ``delta_chain`` every delta to apply,
    in order, as (step, prefix): the last one alone for cumulative deltas, every delta of the
    full up to ``delta_step`` for chained ones. Ordered by (full_step, delta_step).
    """

    full_step: int
    delta_step: int
    full_prefix: str = ""
    delta_prefix: str = ""
    savedmodel_dir: str = ""
    run_dir: str = ""
    delta_chain: tuple[tuple[int, str], ...] = ()

    @property
    def is_version_dir(self) -> bool:
        """True for a version directory of TF Serving's layout (see
        :mod:`processor.store.checkpoint_layout`)."""
        return self.full_step >= 0 and not self.full_prefix

    @property
    def number(self) -> int:
        """TF Serving's number of this version: the full checkpoint's global step (a version
        directory's number), ``0`` when parameters come from the SavedModel's own variables."""
        return max(self.full_step, 0)

    @property
    def label(self) -> str:
        if self.full_step < 0:
            return "savedmodel"
        return f"{self.full_step}" if self.delta_step < 0 else f"{self.full_step}+{self.delta_step}"
