"""The Backend protocol: what the SessionGroup needs from an engine (TensorFlow, ONNX Runtime).

A backend holds ONE copy of the model's parameters and offers ``lanes`` independent execution
lanes over it (TensorFlow: inter-op pools of one Session; ONNX Runtime: sessions sharing
initializers). Contract:

* ``run`` is thread-safe: any number of threads may call it at once, on the same or different
  lanes. It raises :class:`~processor.errors.ProcessorError` (INVALID_ARGUMENT for inputs the
  engine rejects, INTERNAL otherwise).
* ``close`` is called once, after the last ``run`` has returned (the ServableHandle guarantees
  it); it frees the parameters.
* ``run_traced`` (timeline tracing) is ``run`` with the engine's full per-op profiling for this
  one call; same threading, feeds, fetches, outputs and errors. It returns ``(outputs,
  EngineTrace)``: one :class:`~processor.tracing.TraceEvent` per executed op (name, op type,
  device, engine thread, start in microseconds since the Unix epoch, duration in microseconds),
  or a serialized TensorFlow ``StepStats`` for engines that make one natively. Tracing must not
  change outputs or leave profiling on for other calls. An engine that cannot trace a single
  call raises NotImplementedError; the request then runs untraced and its timeline holds only
  the processor's stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..checkpoint.delta import Delta, VariableInfo
from ..signature import Signature

if TYPE_CHECKING:
    from ..tracing.events import EngineTrace
    from ..wire_codec import WireCodec
    from .update_gate import UpdateGate


class Backend(Protocol):
    engine_name: str  # "tensorflow" or "onnxruntime"
    signature: Signature  # the default one (the config's signature_name): what run() serves
    signatures: dict[str, Signature]  # every signature served, by name (the default one included)
    lanes: int
    # String inputs ``run`` also takes as uint64 TensorFlow Fingerprint64 arrays (the native
    # decoder hashes them without the GIL); empty for engines that take the strings themselves.
    fingerprinted_inputs: frozenset[str]

    def run(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run the signature on ``lane``: feeds keyed by input alias, fetches by output alias."""
        ...

    def run_signature(self, lane: int, name: str, feeds: dict[str, np.ndarray],
                      fetches: tuple[str, ...]) -> list[np.ndarray]:
        """``run`` of ``signatures[name]``, another signature than the default (engines serving
        one signature never get this call). Same threading and errors as ``run``."""
        ...

    @property
    def variables(self) -> dict[str, VariableInfo]:
        """The parameters a delta may update, by checkpoint name."""
        ...

    def read_delta(self, prefix: str, step: int) -> Delta:
        """Read a delta checkpoint and check it against this model (off the request path)."""
        ...

    def stage_delta(self, delta: Delta) -> None:
        """Before ``apply_delta``, off the request path: write what shared stores hold."""
        ...

    def apply_delta(self, delta: Delta) -> None:
        """Write a checked delta into the weights all lanes share. Called with no run in flight."""
        ...

    def update_gate(self) -> UpdateGate:
        """A new gate for the group over this backend: an :class:`UpdateGate`, or one that
        holds other processes' runs too where they read the weights this one writes."""
        ...

    def wire_server(self, codec: WireCodec) -> Callable[[int, bytes | memoryview], bytes | None] | None:
        """A whole-request path for ``codec``'s requests, or None: ``serve(lane, data)`` returns
        the PredictResponse bytes, or None for a request the caller must take the reference way
        (decode, ``run``, encode). Thread-safe; called under the update gate."""
        ...

    def timed_wire_server(self, codec: WireCodec) -> Callable[[int, bytes | memoryview], Any] | None:
        """:meth:`wire_server` with its stages' times, for a request OpenTelemetry sampled:
        ``serve(lane, data)`` returns (response bytes, (start, decoded, ran, encoded, rows)),
        ns since the epoch (rows -1: no input is per row), or None as :meth:`wire_server`'s.
        None where the backend has no whole-request path."""
        ...

    @property
    def native_engine(self) -> Any | None:
        """The native engine that runs whole requests without Python (``processor._native
        .OrtEngine``), which batches run on too; None where batches run through :meth:`run`."""
        ...

    def run_traced(self, lane: int, feeds: dict[str, np.ndarray],
                   fetches: tuple[str, ...]) -> tuple[list[np.ndarray], EngineTrace]:
        """``run`` with full per-op tracing of this call (see the module doc)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Engine facts for model info: threads, pools, pinning, devices."""
        ...

    def memory(self) -> dict[str, int]:
        """The bytes this loaded version holds, by part: every part of
        :data:`processor.memory.PARTS`, 0 where nothing is held (see
        :meth:`~processor.engine.session_group.SessionGroup.memory`). Cheap: no walk of the
        parameters per call (model info and metrics call it); thread-safe."""
        ...

    def close(self) -> None:
        ...
