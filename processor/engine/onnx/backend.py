"""ONNX Runtime backend: N ``InferenceSession``s over ONE copy of the parameters.

The model is prepared by :mod:`processor.engine.onnx.convert` (a SavedModel converted with
tf2onnx and checked against TensorFlow, or a ``.onnx`` file; cached). Its parameters live in
buffers this backend owns (:mod:`.param_buffers`): numpy arrays on the host, PyTorch tensors on
each GPU a lane runs on; every session gets those of its place through
``SessionOptions.add_initializer`` over a DLPack tensor, which does not copy, so N sessions in
one place cost one copy of the weights plus their own activation memory. The buffers are
released after the last session that reads them is gone (:meth:`close` drops the sessions
first). Weight prepacking is disabled (``session.disable_prepacking``) so that no session keeps
a private, repacked copy.

Threads: with ``use_per_session_threads`` every session has its own intra-op pool of
``intra_op_parallelism_threads`` threads (the calling thread is one of them); otherwise all
sessions share ONE process-wide pool (``onnxruntime.set_global_thread_pool_sizes``), sized by
the first model that asks for it. ORT's global pools are process state with two rules (measured
with 1.31.1): they must be sized before the first session that uses them, and once they exist
ORT refuses every new session with its own pools ("use_per_session_threads must be false when
using a global thread pool"). So after one model in the process asked for global pools, later
sessions use them too, whatever their config; model info says so. ``cpusets`` pin each session's pool workers with
``session.intra_op_thread_affinities``; what the kernel actually applied is read back from
``/proc`` and reported. ``enable_inline_execute`` has nothing to change: ORT runs a graph on
the calling thread, helped by the intra-op pool.

GPU: one CUDA execution provider per session on the lane's GPU (its own compute stream); see
:mod:`processor.engine.device_plan` for how lanes map to sessions. With
``enable_device_placement_optimization`` the graph is split at its embedding lookups
(:mod:`.placement`, :mod:`.split`): each engine session is two sessions, the lookups and tables on
the CPU provider, the dense part on the lane's device (the CPU too on a host without a GPU);
a request runs both, through the Python binding.

Native engine (:mod:`.native_engine`): on CPU lanes of an unsplit graph (GPU lanes too with
``native_engine_gpu_lanes``, its own CUDA sessions), a second set of sessions over the same
host parameter arrays, created through ONNX Runtime's C API, serves whole wire requests without
the GIL (:meth:`wire_server`) and, where no input needs converting and every output is numeric,
the arrays of every other front-end (:meth:`run`: TF Serving, KServe v2); the binding sessions
above serve everything else (what the engine does not take or refuses, warm-up, traces).

Parameter updates (hot update): :meth:`update_parameter` writes new values, whole or by rows,
into the shared buffers in place (every copy: the host's and each GPU's); every session sees
them on its next run, on CPU and GPU lanes alike. ``apply_delta`` uses it for delta
checkpoints. Updates are not atomic against runs in flight (a run may read some old and some
new rows); the SessionGroup's update gate holds runs while a delta is applied. A full update
loads a new backend beside this one and swaps, as on the CPU.

Timeline tracing (:meth:`run_traced`): a traced call runs on profiling sessions of its own
(:mod:`.traced_run`). ``run`` is untouched by any of it.

Thread-safety: ``run`` and ``run_traced`` from any number of threads (ORT sessions are
thread-safe); ``update_parameter`` / ``apply_delta`` from one thread at a time.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

import numpy as np

from ...checkpoint.delta import CheckpointError, Delta, VariableInfo, read_delta
from ...config import ModelConfig
from ...errors import ConfigError, Internal, InvalidArgument
from ...memory import memory_parts
from ...store.model_version import ModelVersion
from .. import device_plan, pinning
from ..shared_update_gate import SharedUpdateGate
from ..update_gate import UpdateGate
from ..string_hash import fingerprint
from . import native_engine, placement
from .convert import prepare
from .param_buffers import Parameters
from .weights import host_parameters
from .ort_env import ensure_global_thread_pools, global_pools_in_force, intra_op_affinities, ort as _ort
from .ort_errors import engine_error as _engine_error
from .traced_run import TracedRuns

log = logging.getLogger(__name__)

# Distinct output selections remembered per backend (clients use a handful; bounded so that a
# client cycling through output_filter permutations cannot grow it).
_FETCH_CACHE_SIZE = 64
class OnnxRuntimeBackend:
    """See the module doc."""

    engine_name = "onnxruntime"

    def __init__(self, config: ModelConfig, version: ModelVersion, plan: device_plan.DevicePlan,
                 pinned: bool = False) -> None:
        """Cheap: what to load and where; :meth:`load` (or :meth:`open`) loads it. ``pinned``:
        loaded to be pinned (its own parameter segment with workers: ``map_parameters``)."""
        self._config = config
        self._version = version
        self._plan = plan
        self._pinned = pinned
        self.lanes = len(plan.lanes)
        self._sessions: list[Any] = []
        self._part_sessions: list[Any] = []  # sessions of graph parts (part_runs), closed with the rest
        self._lane_run: list[Any] = []
        self._engine = None
        self._parameters: Parameters | None = None
        self._segment = None
        self._shared_gate: SharedUpdateGate | None = None
        self._traced = TracedRuns(self)
        self._memory: dict[str, int] = memory_parts()  # counted once loaded (see memory)

    @classmethod
    def open(cls, config: ModelConfig, version: ModelVersion, plan: device_plan.DevicePlan,
             pinned: bool = False) -> OnnxRuntimeBackend:
        """A backend with ``version`` loaded (:meth:`load`); raises as it does."""
        backend = cls(config, version, plan, pinned)
        backend.load()
        return backend

    def load(self) -> None:
        """Convert (or reuse) the model's ONNX graph, place its parameters (shared memory when
        workers run), open one session per lane group and the native engine where it serves.
        Raises ConfigError / Internal, having closed what it opened."""
        config, version, plan = self._config, self._version, self._plan
        self._prepared = prepare(version.savedmodel_dir, version, config.signature_name)
        self.signature = self._prepared.signature
        # tf2onnx converts one signature (the config's signature_name): a request naming another
        # is refused with TF Serving's "Serving signature key ... not found."
        self.signatures = {self.signature.name: self.signature}
        self._hashed = set(self._prepared.hashed_inputs)
        self.fingerprinted_inputs = frozenset(self._hashed)
        self._strings = {a for a, s in self.signature.inputs.items() if s.dtype == 7 and a not in self._hashed}
        self._converted = self._hashed | self._strings  # inputs _feeds must convert
        self._input_names = {a: s.name for a, s in self.signature.inputs.items()}
        self._output_names = {a: s.name for a, s in self.signature.outputs.items()}
        self._fetch_names: dict[tuple[str, ...], list[str]] = {}
        table = self._prepared.manifest["parameters"]
        self._by_variable = {p["variable"]: n for n, p in table.items() if p.get("variable")}
        self._variable_shapes = {n: tuple(p.get("variable_shape", p["shape"])) for n, p in table.items()}

        self._forced_global = config.use_per_session_threads and global_pools_in_force() is not None
        per_session = config.use_per_session_threads and not self._forced_global
        self._per_session = per_session
        self._cpusets = cpusets = config.cpusets if per_session else ()
        if cpusets:
            pinning.check_cpus(cpusets)
        self._global_pools = None
        if not per_session:
            self._global_pools = ensure_global_thread_pools(config.intra_op_parallelism_threads,
                                                             config.inter_op_parallelism_threads)
        self._session_lanes: dict[int, list[int]] = {}
        for d in plan.lanes:
            self._session_lanes.setdefault(d.session, []).append(d.lane)
        self._pins: list[dict[str, Any]] = []
        self._placement = placement.plan_placement(config.enable_device_placement_optimization,
                                                   self._prepared.model_path, plan.on_gpu)
        self._split = self._placement.split
        # workers > 1: the parameters live in one shared-memory segment for every worker
        params, self._segment, self._shared_gate = host_parameters(
            self._prepared.directory, self._prepared.manifest["parameters"], on_gpu=plan.on_gpu,
            delta_step=version.delta_step, pinned=self._pinned)
        self._parts = [self._placement.parts(self._prepared.model_path, self._session_target(index)[0],
                                             frozenset(params)) for index in range(plan.sessions)]
        needs: dict[int | None, set[str]] = {}
        for part in (part for parts in self._parts for part in parts):
            needs.setdefault(part.device.gpu, set()).update(part.parameters)
        try:
            self._parameters = Parameters(params, needs)
            del params  # parameters only a GPU needs leave host memory
            for index, parts in enumerate(self._parts):
                cpus = self._session_target(index)[1]
                self._sessions.append([self._open_session(index, part, cpus) for part in parts])
        except Exception:
            self.close()
            raise
        # InferenceSession.run re-checks the feed names in Python on every call; the feeds here
        # are checked against the signature already, so requests call the binding's run itself.
        self._lane_run = [self._session_run(self._sessions[d.session]) for d in plan.lanes]
        why_not = ("GPU lanes serve through the ONNX Runtime Python binding"
                   if plan.on_gpu and not config.native_engine_gpu_lanes else
                   "device placement splits the graph; its two parts run through the Python binding"
                   if self._split is not None else
                   f"string inputs {sorted(self._strings)} are not hashed" if self._strings else "")
        host = self._parameters.sets.get(None)
        self._engine, self._engine_report = native_engine.open_engine(
            self._prepared.model_path, self.signature, host.host_arrays() if host and not why_not else {},
            [(*self._session_threads(cpus), device_plan.cuda_options(device))
             for device, cpus in map(self._session_target, range(plan.sessions))],
            [d.session for d in plan.lanes], self._global_pools, why_not)
        self._native_gpu_copies = self._engine is not None and plan.on_gpu
        # arrays run on the engine too (run_arrays) wherever it serves (GPU lanes: ONNX Runtime
        # copies the host inputs in and the outputs out, as for the wire format) when no feed
        # needs converting and every output is numeric; else the binding session runs them
        numeric = all(s.dtype != 7 for s in self.signature.outputs.values())
        self._array_engine = self._engine if self._engine is not None and numeric and not self._converted else None
        self._input_index = {alias: i for i, alias in enumerate(self.signature.inputs)}
        self._output_index = {alias: i for i, alias in enumerate(self.signature.outputs)}
        self._memory = self._count_memory(table)

    def _count_memory(self, table: dict[str, Any]) -> dict[str, int]:
        """The parts :meth:`memory` reports, fixed once loaded (a delta overwrites in place)."""
        sets = self._parameters.sets
        host = sets.get(None)
        device = sum(s.nbytes for place, s in sets.items() if place is not None)
        if self._native_gpu_copies:  # each native GPU session holds a device copy of its own
            device += sum(int(p["length"]) for p in table.values()) * self._plan.sessions
        segment = self._segment
        return memory_parts({"weights": host.nbytes if host is not None and segment is None else 0,
                             "shared": segment.size if segment is not None else 0, "device": device})

    def memory(self) -> dict[str, int]:
        """The bytes this version holds, by part (:data:`processor.memory.PARTS`, all present):
        ``weights``, the host parameter buffers this process owns; ``shared``, instead, the
        shared-memory segment they live in with workers (its whole mapping, once); ``device``,
        the GPU parameter buffers (and the native engine's own copy per GPU session where it
        serves GPU lanes); ``tables`` / ``caches`` 0 (no feature store on this backend). Counted
        once at load from the buffers' sizes; ONNX Runtime's own allocations (graph, prepacked
        kernels, arenas) are not counted. All 0 once closed."""
        return self._memory

    def _session_target(self, index: int) -> tuple[device_plan.LaneDevice, tuple[int, ...] | None]:
        """(device, cpus) of session ``index``: those of its first lane."""
        first_lane = self._session_lanes[index][0]
        return self._plan.lanes[first_lane], (self._cpusets[first_lane] if self._cpusets else None)

    def _session_threads(self, cpus: tuple[int, ...] | None) -> tuple[bool, int, int, str]:
        """(per-session pools, intra, inter, intra_op_thread_affinities) of a session on ``cpus``."""
        if not self._per_session:
            return False, 0, 0, ""
        intra = self._config.intra_op_parallelism_threads or (len(cpus) if cpus else 0)
        affinities = intra_op_affinities(cpus, intra) if cpus and intra > 1 else ""
        return True, intra, self._config.inter_op_parallelism_threads, affinities

    def _session_run(self, sessions: list[Any]):
        """The binding's ``run(names, feeds, options)`` of one engine session (both parts if split).

        ``InferenceSession._sess.run``, not the public ``InferenceSession.run``: the public one only
        adds Python-side checks before calling it (every required input fed, OrtValue devices, no
        WebGPU graph capture), and reads each input's metadata through the binding to do so:
        4 us per call for the 2-input DLRM model, about 20 us for 40 inputs (measured here, ORT
        1.32). The codec has already checked the feeds against the signature, the feeds are numpy
        arrays, and these sessions run on the CPU or CUDA, so those checks never fire here.
        ``_sess`` is the binding object the public ``run`` calls; a release that renamed it would
        fail every ONNX Runtime test at once."""
        if self._split is None:
            return sessions[0]._sess.run
        return functools.partial(self._split.run, sessions[0]._sess.run, sessions[1]._sess.run)

    def _session_options(self, cpus: tuple[int, ...] | None, part: placement.Part):
        ort = _ort()
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.log_severity_level = 3
        per_session, intra, inter, affinities = self._session_threads(cpus)
        if per_session:
            options.intra_op_num_threads = intra
            options.inter_op_num_threads = inter
            if affinities:
                options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        else:
            options.use_per_session_threads = False
        self._parameters.sets[part.device.gpu].add_to(options, sorted(part.parameters))
        return options

    def _open_session(self, index: int, part: placement.Part, cpus: tuple[int, ...] | None):
        """A session of ``part`` over the shared parameters of its place (which counts it as a user)."""
        ort, device = _ort(), part.device
        options = self._session_options(cpus, part)
        with pinning.creation_lock, pinning.new_threads() as created:
            try:
                session = ort.InferenceSession(part.model_path, options, providers=device_plan.ort_providers(device))
            except Exception as exc:
                raise Internal(f"ONNX Runtime could not load {part.model_path!r}: "
                               f"{type(exc).__name__}: {exc}") from exc
        self._parameters.sets[device.gpu].attach(session._sess)
        if device.gpu is not None and "CUDAExecutionProvider" not in session.get_providers():
            raise ConfigError(f"gpu_ids_list: ONNX Runtime could not start CUDA on GPU {device.gpu} "
                              f"(providers: {session.get_providers()}); check the CUDA 13 / cuDNN 9 libraries")
        self._pins.append(self._pin_report(index, cpus, created))
        if part.role != "whole":
            self._pins[-1]["part"] = part.role
        return session

    def _pin_report(self, index: int, cpus: tuple[int, ...] | None, created: dict[int, str]) -> dict[str, Any]:
        report: dict[str, Any] = {"session": index, "lanes": self._session_lanes[index],
                                  "pool_threads_created": len(created)}
        if cpus is None:
            return report
        # ORT's workers pin themselves when they start, which may be just after the session is
        # returned: read the kernel's view until every worker shows it (or 2 s pass).
        workers = max(0, (self._config.intra_op_parallelism_threads or len(cpus)) - 1)
        deadline = time.monotonic() + 2.0
        while True:
            pinned = []
            for tid in created:
                try:
                    if os.sched_getaffinity(tid) == set(cpus):
                        pinned.append(tid)
                except OSError:
                    pass
            if len(pinned) >= workers or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        report.update(cpus=list(cpus), threads_pinned=len(pinned))
        return report

    # --- serving ------------------------------------------------------------------------------

    def _feeds(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self._input_names
        if not self._converted:
            return {names[alias]: value for alias, value in feeds.items()}
        out = {}
        for alias, value in feeds.items():
            if alias in self._hashed:
                if value.dtype != np.uint64:  # else fingerprinted by the native decoder already
                    try:
                        value = fingerprint(value)
                    except TypeError as exc:
                        raise InvalidArgument(f"input {alias!r}: {exc}") from None
            elif alias in self._strings:
                try:
                    value = np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in value.reshape(-1)],
                                     dtype=object).reshape(value.shape)
                except UnicodeDecodeError:
                    raise InvalidArgument(f"input {alias!r}: ONNX Runtime takes UTF-8 strings only") from None
            out[names[alias]] = value
        return out

    def _output_list(self, fetches: tuple[str, ...]) -> list[str]:
        names = self._fetch_names.get(fetches)
        if names is None:
            names = [self._output_names[a] for a in fetches]
            if len(self._fetch_names) < _FETCH_CACHE_SIZE:
                self._fetch_names[fetches] = names
        return names

    def run(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """The outputs ``fetches`` (aliases) for ``feeds`` (checked against the signature) on
        ``lane``: on the native engine without the GIL where it takes the arrays, else (and for
        anything it refuses, so errors are the binding's) on the lane's binding session."""
        engine = self._array_engine
        if engine is not None:
            index, out = self._input_index, self._output_index
            outputs = engine.run_arrays(lane, [(index[alias], value) for alias, value in feeds.items()],
                                        [out[alias] for alias in fetches])
            if outputs is not None:
                return outputs
        return self.run_binding(lane, feeds, fetches)

    def run_binding(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """:meth:`run` on the lane's Python-binding session alone (the reference of the engine)."""
        ort_feeds = self._feeds(feeds)
        try:
            return self._lane_run[lane](self._output_list(fetches), ort_feeds, None)
        except Exception as exc:
            raise _engine_error(exc) from exc

    def feeds_by_name(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Checked feeds by alias as the graph takes them: by tensor name, strings hashed or
        decoded where the graph wants that (what :meth:`run_binding` feeds)."""
        return self._feeds(feeds)

    @property
    def model_path(self) -> str:
        """The prepared ONNX graph every session runs (a cache entry's ``model.onnx``)."""
        return self._prepared.model_path

    @property
    def splits_graph(self) -> bool:
        """Whether device placement split the graph (each lane runs two sessions)."""
        return self._split is not None

    def part_runs(self, model_path: str, parameters: frozenset[str], role: str) -> list[Any]:
        """One binding ``run(names, feeds, options)`` per lane of a session over ``model_path``, a
        part of this model's graph written beside it (the context partition,
        :mod:`.context_part`): opened as the lanes' own sessions are (same devices, threads and
        pinning), over the same parameter buffers for ``parameters`` (no copy; deltas reach
        them), closed with the backend. Raises Internal when ONNX Runtime cannot load it."""
        sessions = []
        held = frozenset(self._parameters.names())
        for index in range(self._plan.sessions):
            device, cpus = self._session_target(index)
            part = placement.Part(role, model_path, device, parameters & held)
            sessions.append(self._open_session(index, part, cpus))
        self._part_sessions.extend(sessions)
        return [sessions[d.session]._sess.run for d in self._plan.lanes]

    def wire_server(self, codec):
        """The native engine's whole-request path for ``codec``'s plan (see :mod:`.native_engine`)."""
        plan, engine = codec.native_plan, self._engine
        if engine is None or plan is None:
            return None
        return functools.partial(engine.serve, plan)

    def timed_wire_server(self, codec):
        """:meth:`wire_server` with its stages' times (the native engine's ``serve_timed``)."""
        plan, engine = codec.native_plan, self._engine
        if engine is None or plan is None:
            return None
        return functools.partial(engine.serve_timed, plan)

    @property
    def native_engine(self):
        """The native engine (see :mod:`.native_engine`), or None where it does not serve."""
        return self._engine

    def run_traced(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]):
        """``run`` on a fresh profiling session: (outputs, EngineTrace of per-op events); see
        :mod:`.traced_run`. NotImplementedError (the request then runs untraced) when no
        profiling session can be opened; the run's own errors are ``run``'s."""
        return self._traced.run(lane, feeds, fetches)

    # --- parameters ---------------------------------------------------------------------------

    @property
    def variables(self) -> dict[str, VariableInfo]:
        """Parameters a delta may update, by TF variable (checkpoint) name (host and GPU alike)."""
        if self._native_gpu_copies:
            return {}
        return {var: VariableInfo(self._variable_shapes[n], self._parameters.dtype(n))
                for var, n in self._by_variable.items()}

    def read_parameter(self, name: str) -> np.ndarray:
        """A host copy of parameter ``name``'s current value (TF variable or initializer name)."""
        return self._parameters.read(self._by_variable.get(name, name))

    def update_parameter(self, name: str, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Write ``values`` into parameter ``name`` in place, for every session.

        ``name`` is a TF variable name (``embeddings/C1``) or an initializer name. Without
        ``rows`` the whole value is replaced (same shape); with ``rows`` (int64 row ids) the
        rows ``values[i]`` go to rows ``rows[i]``. Raises KeyError for an unknown parameter,
        ValueError for a shape mismatch. Every copy is written, the host's and each GPU's
        (:class:`.param_buffers.Parameters`): CPU and GPU lanes alike see it on their next run.
        ConfigError where the native engine serves GPU lanes (``native_engine_gpu_lanes``): its
        sessions read their own copies, which no write reaches.
        """
        if self._native_gpu_copies:
            raise ConfigError("in-place parameter updates do not reach the native engine's GPU sessions "
                              "(native_engine_gpu_lanes); a full reload works")
        key = self._by_variable.get(name, name)
        shape = self._parameters.shape(key)
        values = np.asarray(values, dtype=self._parameters.dtype(key))
        if rows is None:
            if values.shape not in (shape, self._variable_shapes[key]):
                raise ValueError(f"{name}: shape {list(values.shape)}, the parameter's is "
                                 f"{list(self._variable_shapes[key])}")
            self._parameters.write(key, values.reshape(shape))
        else:
            rows = np.asarray(rows, dtype=np.int64)
            if values.shape != (len(rows), *shape[1:]):
                raise ValueError(f"{name}: {len(rows)} rows of shape {list(values.shape)} do not fit "
                                 f"{list(shape)}")
            if len(rows) and (rows.min() < 0 or rows.max() >= shape[0]):
                raise ValueError(f"{name}: row ids outside [0, {shape[0]})")
            self._parameters.write(key, values, rows)

    def update_gate(self) -> UpdateGate:
        """The group's gate: across processes where the parameters are a segment every worker
        writes (:mod:`..shared_update_gate`), else this process's."""
        return self._shared_gate if self._shared_gate is not None else UpdateGate()

    def read_delta(self, prefix: str, step: int) -> Delta:
        """Read and check a delta against the model's parameters."""
        return read_delta(prefix, step, self.variables)

    def stage_delta(self, delta: Delta) -> None:
        """Nothing to stage: every parameter lives in this process."""

    def apply_delta(self, delta: Delta) -> None:
        """Write a checked delta into the shared buffers (no run is in flight: the gate holds them)."""
        variables = self.variables
        for name in [*delta.rows, *delta.dense]:
            if name not in variables:
                raise CheckpointError(f"delta {delta.step}: {name!r} cannot be updated in place on "
                                      f"ONNX Runtime (not an unchanged parameter of the converted graph)")
        for name, (keys, values) in delta.rows.items():
            self.update_parameter(name, values, keys)
        for name, value in delta.dense.items():
            self.update_parameter(name, value)

    # --- facts --------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        ort = _ort()
        config = self._config
        manifest = self._prepared.manifest
        per_session = self._per_session
        pinning_report: dict[str, Any] = {"sessions": self._pins}
        if not config.cpusets:
            pinning_report["summary"] = "no cpusets configured; nothing pinned"
        elif not per_session:
            pinning_report["summary"] = ("cpusets ignored: pinning needs per-session pools "
                                         "(sessions share the process-wide pool)")
        else:
            pinning_report["summary"] = ("intra-op pool workers pinned per session through "
                                         "session.intra_op_thread_affinities; the calling thread is not pinned")
        return {
            "engine": "onnxruntime",
            "engine_version": ort.__version__,
            "lanes": self.lanes,
            "sessions": len(self._sessions),
            "providers": self._sessions[0][-1].get_providers() if self._sessions else [],
            "weights": (f"one copy of {len(self._parameters.names())} parameters per place, in buffers the "
                        f"processor owns, shared by all sessions there (add_initializer over DLPack, no copy)"),
            "parameter_buffers": self._parameters.describe(),
            "shared_memory": ({**self._segment.describe(),
                               **(self._shared_gate.state() if self._shared_gate is not None else {})}
                              if self._segment is not None else
                              "none: one server process (workers 1), or nothing to share"),
            "device_placement": {**self._placement.report, "tables": self._table_places()},
            "threads": ({"mode": "per-session pools", "intra_op_num_threads": config.intra_op_parallelism_threads,
                         "inter_op_num_threads": config.inter_op_parallelism_threads} if per_session else
                        {"mode": "global pools", "sizes_in_force": list(self._global_pools or ()),
                         **({"note": "use_per_session_threads asked for, but an earlier model in this process "
                                     "created ORT's global pools; ORT then refuses per-session pools"}
                            if self._forced_global else {})}),
            "pinning": pinning_report,
            "native_engine": self._engine_report,
            "devices": self._plan.describe(),
            "model": {"source": manifest["source"], "cache": str(self._prepared.directory),
                      "cache_hit": self._prepared.cache_hit, "check": manifest["check"],
                      "string_inputs_hashed_by_processor": sorted(self._hashed),
                      "variables_not_updatable": manifest.get("variables_not_updatable", [])},
        }

    def close(self) -> None:
        self._memory = memory_parts()
        self._traced.close()
        # Sessions first, then the buffers they read: each place frees its memory once the last
        # of its sessions is gone (at once, unless a caller still holds one: a benchmark's bare engine call).
        self._sessions = []
        self._part_sessions = []
        self._lane_run = []
        self._engine = None
        parameters, self._parameters = self._parameters, None
        if parameters is not None:
            parameters.release()
        segment, self._segment = self._segment, None
        if segment is not None:  # the mapping lives on while a bare engine call holds a session
            segment.release()

    def _table_places(self) -> dict[str, list[str]] | str:
        """Where each embedding table lives: the places of a split graph's tables, else one line."""
        if self._split is None:
            return f"with every other parameter, on {[s.location for s in self._parameters.sets.values()]}"
        return {name: self._parameters.location_of(name) for name in self._split.tables}
