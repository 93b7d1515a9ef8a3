"""SessionGroup: the servable. N sessions (lanes) over ONE copy of the weights.

The group owns a :class:`~processor.engine.backend.Backend` and picks a lane per call with the
configured policy (``MOD`` or ``RR``). ``run`` is thread-safe. A delta is applied in place with
:meth:`SessionGroup.apply_delta`, alone (an :class:`UpdateGate` holds requests back for the
few milliseconds of the write), so each request sees one version. The group is closed by its
:class:`~processor.manager.servable_handle.ServableHandle` once no request uses it.

Every signature of the model is served: ``signature`` is the default one (the config's
``signature_name``), ``signatures`` all of them by name; :meth:`SessionGroup.for_signature` is
the group serving another one (a :class:`~processor.engine.signature_view.SignatureView`).

Large requests: with ``max_execution_batch_size`` / ``max_request_rows`` the group has a
:class:`~processor.engine.splitting.RowSplitter`; :meth:`run` (and a view's run) cuts a request
with more rows into chunks run in parallel on the lanes, all inside one shared hold of the update
gate (one version), and refuses one over the row limit. :meth:`serve` sends serialized requests
long enough to hold that many rows through the codec and :meth:`run`; shorter ones keep the
native path (one length check).

A ranking request's context (:mod:`processor.context`): where a request may send an input as
one row for every row (two per-row inputs or more), the default signature's runs go through the
group's :class:`~processor.context.runner.ContextRunner` (chunks of a split request too), which
answers such a request as the tiled one, running the context part once where the model declares
``context_inputs``; a delta empties its cache under the exclusive gate. Other signatures' broadcast
requests are tiled.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..checkpoint.delta import Delta
from ..context.runner import ContextRunner, OtherSignatures
from ..memory import memory_parts
from ..request import served_signature
from ..signature import Signature
from ..store.model_version import ModelVersion
from ..tracing.events import EngineTrace
from ..wire_codec import WireCodec
from .backend import Backend
from .lane_policy import LanePolicy
from .signature_view import SignatureView
from .splitting import RowSplitter
from .update_gate import UpdateGate


class SessionGroup:
    """Lanes over one backend, plus the version they serve. See the module doc."""

    def __init__(self, backend: Backend, policy: str, version: ModelVersion, load_seconds: float,
                 batching=None, splitter: RowSplitter | None = None, context: ContextRunner | None = None) -> None:
        self.backend = backend
        # A ranking request's context (processor/context): every run of the default signature goes
        # through the runner where a request may send an input as one row for every row.
        self.context = context
        self._engine_run = context.run if context is not None and context.may_broadcast else backend.run
        self._other_signatures = OtherSignatures()
        self.signature: Signature = backend.signature  # fixed for the group's life (read per request)
        # every signature the backend serves, by name (the default one included)
        self.signatures: dict[str, Signature] = dict(getattr(backend, "signatures", None) or
                                                     {backend.signature.name: backend.signature})
        self._views: dict[str, SignatureView] = {}
        self.version = version
        self.load_seconds = load_seconds
        self._policy = LanePolicy(policy, backend.lanes)
        self._gate = backend.update_gate()  # across worker processes where they share the weights
        if context is not None:  # its cache follows other workers' writes into shared weights
            context.weights_stamp = self._gate.weights_stamp
        self.codec = WireCodec(backend.signature, backend.fingerprinted_inputs)
        self._wire_server = backend.wire_server(self.codec)
        self.splitter = splitter
        # serialized requests longer than this may hold too many rows to run whole: decoded first
        self._split_bytes = splitter.wire_bytes(self.signature) if splitter is not None else 1 << 62
        # This version's native batching queue (closed before the backend), on the model's row
        # budget, when the model batches (``batching``: its ModelBatching) and the queue can serve.
        self.batch_queue = batching.open_queue(backend, self.codec) if batching is not None else None
        self._direct_lane = None  # its door for the C ABI's direct path (open_direct_lane), made on demand
        # serve() runs the whole request in native code without the GIL (the ONNX Runtime native
        # engine): an event loop may call it in place for small requests (DataPlane.submit)
        self.serves_natively = self._wire_server is not None and getattr(backend, "native_engine", None) is not None
        # the same with its stages' times, for a request OpenTelemetry sampled (serve_timed)
        self._wire_timed = backend.timed_wire_server(self.codec) if self.serves_natively else None

    @property
    def lanes(self) -> int:
        return self.backend.lanes

    def for_signature(self, name: str) -> SessionGroup | SignatureView:
        """This group serving signature ``name`` (itself for the default one); SignatureNotFound
        when the model has no such signature."""
        if name == self.signature.name:
            return self
        view = self._views.get(name)
        if view is None:
            view = self._views.setdefault(name, SignatureView(self, served_signature(name, self.signatures)))
        return view

    def pick_lane(self) -> int:
        return self._policy.pick()

    def run_signature(self, name: str, lane: int | None, feeds: dict[str, np.ndarray],
                      fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run signature ``name`` (not the default one) on ``lane`` (None: the policy's)."""
        with self._gate.shared():
            if lane is None:
                splitter = self.splitter
                if splitter is not None:
                    signature = self.signatures[name]
                    chunks = splitter.chunks(signature, feeds)
                    if chunks is not None:
                        return splitter.run(signature, chunks, feeds, fetches,
                                            lambda lane_, f, o: self.backend.run_signature(
                                                lane_, name, self._other_signatures.tiled(signature, f), o))
                lane = self._policy.pick()
            return self.backend.run_signature(lane, name, self._other_signatures.tiled(self.signatures[name], feeds),
                                              fetches)

    def run(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run on the lane the policy picks for the calling thread; a request with more rows than
        the splitter's chunk runs split across the lanes (see the module doc)."""
        splitter = self.splitter
        if splitter is not None:
            chunks = splitter.chunks(self.signature, feeds)
            if chunks is not None:
                with self._gate.shared():
                    return splitter.run(self.signature, chunks, feeds, fetches, self._engine_run)
        return self._run_whole(feeds, fetches)

    def _run_whole(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        gate = self._gate
        gate.enter_shared()  # not a `with`: this is the request path's hottest Python
        try:
            return self._engine_run(self._policy.pick(), feeds, fetches)
        finally:
            gate.exit_shared()

    def serve(self, data: bytes | memoryview, in_place: bool = False) -> bytes | None:
        """Serialized PredictRequest in, serialized PredictResponse out, on the policy's lane.

        The backend's whole-request native path when it has one (no GIL from the request bytes
        to the response bytes); requests it does not take (invalid ones, rare forms, engine
        errors, a ranking request's one-row context) and engines without one go through the
        codec and :meth:`run`, which give the reference results and errors. ``in_place`` (an
        event loop's call: ``DataPlane.submit``): None instead, for the caller to run it on
        a thread (the reference path may take milliseconds). Raises ProcessorError.
        """
        wire = self._wire_server
        whole = len(data) <= self._split_bytes  # too short to hold more rows than run whole
        if wire is not None and whole:
            out = self._whole(wire, self._policy.pick(), data)
            if out is not None:
                return out
        if in_place:
            return None
        return self.serve_reference(data)

    def serve_timed(self, data: bytes | memoryview) -> tuple[bytes, tuple, int] | None:
        """:meth:`serve`'s native path for a request OpenTelemetry sampled: (response bytes,
        (start, decoded, ran, encoded, rows) in ns since the epoch, lane), or None where it
        does not take the request (the caller then takes the staged path)."""
        timed = self._wire_timed
        if timed is None or len(data) > self._split_bytes:
            return None
        lane = self._policy.pick()
        out = self._whole(timed, lane, data)
        return None if out is None else (out[0], out[1], lane)

    def _whole(self, wire, lane: int, data: bytes | memoryview):
        """``wire(lane, data)``, a whole-request native path, under the update gate."""
        gate = self._gate
        gate.enter_shared()
        try:
            return wire(lane, data)
        finally:
            gate.exit_shared()

    def serve_reference(self, data: bytes | memoryview) -> bytes:
        """:meth:`serve` through the codec and :meth:`run`, without trying the native path (for a
        request that path declined already). Raises ProcessorError."""
        codec = self.codec
        feeds, keys, aliases = codec.decode(data)
        return codec.encode(keys, (self._run_whole if len(data) <= self._split_bytes else self.run)(feeds, aliases))

    @property
    def gate(self) -> UpdateGate:
        """The update gate. Callers of :attr:`batch_queue` (see
        :mod:`processor.batching.model_batching`) hold it shared from their first submit until
        their last ticket is answered, so a delta waits for their batches (the queue's runner
        calls the backend without entering it)."""
        return self._gate

    def open_direct_lane(self) -> Any | None:
        """This version's door to its native batching queue for callers that bypass Python (the C
        ABI's direct path: ``native/src/direct_front.h``), made once; None without a native
        queue. A delta closes it while it writes (:meth:`apply_delta`), :meth:`close` for good
        before the queue closes. Thread-safe."""
        queue = self.batch_queue
        if queue is None:
            return None
        if self._direct_lane is None:
            from .. import native

            self._direct_lane = native.MODULE.DirectLane(queue)
        return self._direct_lane

    def batch_stats(self) -> dict[str, Any] | None:
        """The native queue's counters (added into :class:`BatchStats`' snapshot), or None."""
        return self.batch_queue.stats() if self.batch_queue is not None else None

    def serve_on(self, lane: int, data: bytes) -> bytes | None:
        """The whole-request native path on a given lane (warmup); None where there is none."""
        if self._wire_server is None:
            return None
        with self._gate.shared():
            return self._wire_server(lane, data)

    def run_on(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run on a given lane (warmup visits every lane)."""
        with self._gate.shared():
            return self._engine_run(lane, feeds, fetches)

    def run_traced(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...],
                   full: bool = True) -> tuple[int, list[np.ndarray], EngineTrace | None]:
        """``run`` with the engine's full tracing: (lane, outputs, engine trace or None).

        None when the backend cannot trace one call (no ``run_traced``, or NotImplementedError):
        the request then runs untraced. A request the splitter splits runs split, untraced.
        ``full`` False: untraced, only the lane told (an OpenTelemetry span's attribute).
        """
        lane = self._policy.pick()
        traced = getattr(self.backend, "run_traced", None) if full else None
        if traced is not None and self.context is not None and self.context.broadcasts(feeds):
            traced = None  # the context runner's runs are not the engine's one traced call
        with self._gate.shared():
            chunks = self.splitter.chunks(self.signature, feeds) if self.splitter is not None else None
            if chunks is not None:
                return lane, self.splitter.run(self.signature, chunks, feeds, fetches, self._engine_run), None
            if traced is not None:
                try:
                    outputs, trace = traced(lane, feeds, fetches)
                    return lane, outputs, trace
                except NotImplementedError:
                    pass
            return lane, self._engine_run(lane, feeds, fetches), None

    def apply_delta(self, delta: Delta, version: ModelVersion) -> float:
        """Write a checked delta into the live weights; return the seconds requests were held."""
        started = time.monotonic()
        gate = self._gate
        lane = self._direct_lane
        if lane is not None:  # direct calls bypass the gate: they wait for the delta in Python
            lane.close()
        try:
            with gate.exclusive():
                if self.context is not None:
                    self.context.invalidate()  # cached contexts hold the old weights' results
                gate.apply(delta.step, lambda: self.backend.apply_delta(delta))  # skipped if another worker wrote it
                self.version = version
        finally:
            if lane is not None:
                lane.open()
        return time.monotonic() - started

    def memory(self) -> dict[str, int]:
        """The bytes this served version holds, by part, every part present (0 where nothing is
        held), in bytes:

        * ``weights``: the engine's parameters in this process's own host memory (ONNX Runtime:
          its host parameter buffers; TensorFlow: its variables as loaded, shape x dtype size);
        * ``tables``: the embedding tables the feature store holds in this process for the
          version (DRAM tables; the DRAM tier of DRAM+SSD tables, not the SSD file);
        * ``caches``: the hot-row cache in front of Redis / Redis Cluster, in use;
        * ``shared``: the shared-memory segments the version maps (workers > 1: ONNX Runtime
          parameters, DRAM / DRAM+SSD tables), each counted once for this version, in this part
          only (the same bytes are mapped by every worker serving it);
        * ``device``: GPU memory of the version's device parameter copies (0 on CPU).

        What the engines allocate themselves (graphs, kernels' buffers, arenas, the runtime) is
        not counted. Cheap: fixed parts are counted at load; the tables' part is recomputed from
        the arrays' sizes, so it follows deltas. Thread-safe."""
        return memory_parts(self.backend.memory())

    def describe(self) -> dict[str, Any]:
        return {
            "select_session_policy": self._policy.policy,
            "session_num": self.lanes,
            "load_seconds": round(self.load_seconds, 3),
            "request_codec": self.codec.describe(),
            "splitting": self.splitter.describe() if self.splitter is not None else None,
            "context": self.context.describe() if self.context is not None else None,
            **self.backend.describe(),
        }

    def close(self) -> None:
        if self._direct_lane is not None:
            self._direct_lane.close()  # the direct calls inside leave before their queue closes
        if self.batch_queue is not None:
            self.batch_queue.close()  # no request is left (they hold the handle); stops its threads
            self.batch_queue = None
        if self.splitter is not None:
            self.splitter.close()
        if self.context is not None:
            self.context.close()
        self.backend.close()

