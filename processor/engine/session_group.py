"""SessionGroup: the servable. N sessions (lanes) over ONE copy of the weights.

The group owns a :class:`~processor.engine.backend.Backend` and picks a lane per call with the
configured policy (``MOD`` or ``RR``). ``run`` is thread-safe. A delta is applied in place with
:meth:`SessionGroup.apply_delta`, alone (an :class:`UpdateGate` holds requests back for the
few milliseconds of the write), so each request sees one version. The group is closed by its
:class:`~processor.manager.servable_handle.ServableHandle` once no request uses it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..checkpoint.delta import Delta
from ..config import ModelConfig
from ..errors import ConfigError
from ..signature import Signature
from ..store.checkpoint_layout import ModelVersion
from ..tracing.events import EngineTrace
from .backend import Backend
from .lane_policy import LanePolicy
from .update_gate import UpdateGate


class SessionGroup:
    """Lanes over one backend, plus the version they serve. See the module doc."""

    def __init__(self, backend: Backend, policy: str, version: ModelVersion, load_seconds: float) -> None:
        self.backend = backend
        self.version = version
        self.load_seconds = load_seconds
        self._policy = LanePolicy(policy, backend.lanes)
        self._gate = UpdateGate()

    @property
    def signature(self) -> Signature:
        return self.backend.signature

    @property
    def lanes(self) -> int:
        return self.backend.lanes

    def run(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run on the lane the policy picks for the calling thread."""
        with self._gate.shared():
            return self.backend.run(self._policy.pick(), feeds, fetches)

    def run_on(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run on a given lane (warmup visits every lane)."""
        with self._gate.shared():
            return self.backend.run(lane, feeds, fetches)

    def run_traced(self, feeds: dict[str, np.ndarray],
                   fetches: tuple[str, ...]) -> tuple[int, list[np.ndarray], EngineTrace | None]:
        """``run`` with the engine's full tracing: (lane, outputs, engine trace or None).

        None when the backend cannot trace one call (no ``run_traced``, or NotImplementedError):
        the request then runs untraced.
        """
        lane = self._policy.pick()
        traced = getattr(self.backend, "run_traced", None)
        with self._gate.shared():
            if traced is not None:
                try:
                    outputs, trace = traced(lane, feeds, fetches)
                    return lane, outputs, trace
                except NotImplementedError:
                    pass
            return lane, self.backend.run(lane, feeds, fetches), None

    def apply_delta(self, delta: Delta, version: ModelVersion) -> float:
        """Write a checked delta into the live weights; return the seconds requests were held."""
        started = time.monotonic()
        with self._gate.exclusive():
            self.backend.apply_delta(delta)
            self.version = version
        return time.monotonic() - started

    def describe(self) -> dict[str, Any]:
        return {
            "select_session_policy": self._policy.policy,
            "session_num": self.lanes,
            "load_seconds": round(self.load_seconds, 3),
            **self.backend.describe(),
        }

    def close(self) -> None:
        self.backend.close()


def open_session_group(config: ModelConfig, version: ModelVersion) -> SessionGroup:
    """Load ``version`` into a new SessionGroup with the engine the config names.

    Raises ProcessorError (ConfigError for settings this machine cannot honour, Internal for a
    model or checkpoint that does not load).
    """
    if config.gpu_ids_list or config.use_multi_stream:
        raise ConfigError("gpu_ids_list: GPU execution is not available in this build; "
                          "remove gpu_ids_list/use_multi_stream to serve on the CPU")
    if config.backend == "onnxruntime":
        raise ConfigError("backend: 'onnxruntime' is not available in this build")
    from .tensorflow_backend import TensorFlowBackend

    started = time.monotonic()
    backend = TensorFlowBackend(config, version, lanes=config.session_num)
    return SessionGroup(backend, config.select_session_policy, version, time.monotonic() - started)
