"""SignatureView: a :class:`~processor.engine.session_group.SessionGroup` serving another signature
of its model (TF Serving serves every signature of a SavedModel, chosen per request).

A view has the parts of a group a request uses (``signature``, ``version``, ``backend``,
``lanes``, ``codec``, ``run``, ``run_on``, ``run_traced``, ``serve``, ``batch_queue``), so the
DataPlane, the batching queue and the prediction log take it where they take a group. Its runs
go through the group's update gate and lane policy to the backend's ``run_signature`` (one
parameter copy, one version). A view belongs to its group (made once per signature, on first
use) and lives no longer than the group's handle. Thread-safe as the group is.

What a view does not have: the native whole-request path and the native batching queue (its
wire requests run through the Python codec and batcher) and the engine's per-op trace (a traced
request of another signature records the processor's stages only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..signature import Signature
from ..wire_codec import WireCodec


class SignatureView:
    """See the module doc."""

    batch_queue = None  # no native queue: the reference batcher takes its wire requests

    def __init__(self, group: Any, signature: Signature) -> None:  # group: its SessionGroup
        self._group = group
        self.signature = signature
        self.backend = group.backend
        self.codec = WireCodec(signature)

    @property
    def version(self):
        return self._group.version

    @property
    def lanes(self) -> int:
        return self._group.lanes

    def run(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        return self._group.run_signature(self.signature.name, None, feeds, fetches)

    def run_on(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        return self._group.run_signature(self.signature.name, lane, feeds, fetches)

    def run_traced(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...], full: bool = True):
        """(lane, outputs, None): the engine trace is the default signature's only (``full``
        changes nothing)."""
        lane = self._group.pick_lane()
        return lane, self.run_on(lane, feeds, fetches), None

    def serve_timed(self, data: bytes | memoryview) -> None:
        """None: a view has no native path (:meth:`SessionGroup.serve_timed`)."""
        return None

    def serve(self, data: bytes | memoryview, in_place: bool = False) -> bytes | None:
        """As :meth:`SessionGroup.serve`; ``in_place``: None (a view has no native path)."""
        if in_place:
            return None
        wire = self.codec
        feeds, keys, aliases = wire.decode(data)
        return wire.encode(keys, self.run(feeds, aliases))
