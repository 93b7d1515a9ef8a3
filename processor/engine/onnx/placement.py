"""Device placement on ONNX Runtime: which part of the graph runs where, which parameters live where.

Off (``enable_device_placement_optimization`` false, or a graph that cannot be split): one part,
the whole graph, in one session per engine session on the lane's device; on GPU lanes every
parameter lives in that GPU's buffers. On: the graph split at its embedding lookups
(:mod:`.split`); per engine session, the embedding part (lookups, id preprocessing) in a session
on the CPU provider over the host's buffers (the tables), and the dense part in a session on the
lane's device over that device's buffers. On a host without a GPU both parts run on the CPU
provider: the same split, which is how the tests show it is exact.

A split graph runs through the Python binding (two runs per request); the native engine serves
the unsplit graph on CPU lanes only. Frozen data and functions; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..device_plan import LaneDevice, cpu_side
from .split import SplitGraph, split_at_lookups


@dataclass(frozen=True)
class Part:
    """One session's share of the graph: which model file, on which device, over which parameters."""

    role: str  # "whole", "embedding" or "dense"
    model_path: str
    device: LaneDevice
    parameters: frozenset[str]


@dataclass(frozen=True)
class OrtPlacement:
    """The outcome of planning; ``split`` is None when the whole graph runs in one session."""

    split: SplitGraph | None
    report: dict[str, Any]

    def parts(self, model_path: str, device: LaneDevice, parameters: frozenset[str]) -> tuple[Part, ...]:
        """The parts of one engine session whose lane runs on ``device``."""
        if self.split is None:
            return (Part("whole", model_path, device, parameters),)
        return (Part("embedding", self.split.embedding_path, cpu_side(device),
                     parameters & self.split.embedding_parameters),
                Part("dense", self.split.dense_path, device, parameters & self.split.dense_parameters))


def plan_placement(enabled: bool, model_path: str, on_gpu: bool) -> OrtPlacement:
    """Split ``model_path`` at its lookups when ``enabled``; say what was done and why."""
    if not enabled:
        return OrtPlacement(None, {"enabled": False, "applied": False,
                                   "note": "the whole graph runs in one session per lane, on the lane's device"})
    split = split_at_lookups(model_path)
    if isinstance(split, str):
        return OrtPlacement(None, {"enabled": True, "applied": False, "note": split})
    dense_on = "the lane's GPU" if on_gpu else "the CPU (no GPU in this plan)"
    return OrtPlacement(split, {
        "enabled": True, "applied": True, **split.describe(),
        "note": (f"graph split at its embedding lookups: lookups and tables in a session on the CPU "
                 f"provider, the dense part in a session on {dense_on}; both parts run through the "
                 f"ONNX Runtime Python binding (the native engine serves unsplit graphs only)")})
