"""TensorFlow backend: one graph Session holds the weights; lanes are its inter-op pools.

Stock TensorFlow cannot share variables between two ``Session`` objects (each has its own
ResourceMgr), so DeepRec's SessionGroup is rebuilt here as ONE session with ``lanes`` inter-op
thread pools (``ConfigProto.session_inter_op_thread_pool``); a lane's calls run with
``RunOptions.inter_op_thread_pool = lane`` (or ``-1``, the caller's thread, with inline
execution). Weights are held once whatever the lane count.

Devices: when the lanes' device plan puts them on distinct devices (virtual GPUs with
``use_multi_stream``, several ``gpu_ids_list`` GPUs; virtual CPUs in tests), each device runs its
own copy of the serving subgraph, all copies reading the one set of variables
(:mod:`processor.engine.tensorflow.lane_graphs`); a lane's callables feed and fetch its copy.

Loading follows the SavedModel loader: import the ``serve`` meta graph, restore parameters from
the full checkpoint prefix through the graph's ``saver_def`` (or from the SavedModel's own
variables), run the main / legacy init op. Thread-safe after construction (TF callables are).
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from ... import shared_segments, tensorflow_env
from ...config import ModelConfig, shorten
from ...errors import ConfigError, Internal, InvalidArgument, NotFound, ProcessorError
from ...checkpoint.delta import Delta, VariableInfo, read_delta
from ...features.ev_checkpoint import StoreDelta, read_store_delta
from ...store.model_version import ModelVersion
from .. import device_plan, pinning
from . import embedding_lookup, lane_graphs, op_libraries
from .signature import SERVE_TAGS, signature_from_def
from ...memory import memory_parts
from ..update_gate import UpdateGate
from .variables import VariableUpdater, check_outputs_restored, restored_variables, variable_bytes

_TRACE_LOCK = threading.Lock()  # FULL_TRACE runs: one profiling session per process
UPDATE_POOL_NAME = "processor_model_update"


def _tf():
    import tensorflow as tf  # imported on first use: it costs seconds and most memory

    return tf


class TensorFlowBackend:
    """A SavedModel graph in one Session with ``lanes`` inter-op pools. See the module doc."""

    engine_name = "tensorflow"

    fingerprinted_inputs: frozenset[str] = frozenset()  # the graph hashes its strings itself

    def __init__(self, config: ModelConfig, version: ModelVersion, lanes: int,
                 devices: device_plan.DevicePlan | None = None, features=None) -> None:
        """Cheap: what to load and where; :meth:`load` (or :meth:`open`) loads it."""
        self.lanes = lanes
        self._config = config
        self._version = version
        self._devices = devices or device_plan.cpu_plan(lanes)
        self._features = features
        self._session = None
        self._embedding: embedding_lookup.EmbeddingService | None = None
        self._weights: dict[str, int] = {}  # the variables' bytes by memory part, counted at load
        self._callables: dict[tuple[int, tuple[str, ...]], Any] = {}  # (graph copy, fetches)
        # The request path's callables, by (lane, fetches): the lane's run options built in.
        self._lane_callables: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._callables_lock = threading.Lock()
        # Other signatures' callables, by (lane, signature name, fetches), on graph copy 0.
        self._signature_callables: dict[tuple[int, str, tuple[str, ...]], Any] = {}

    @classmethod
    def open(cls, config: ModelConfig, version: ModelVersion, lanes: int,
             devices: device_plan.DevicePlan | None = None, features=None) -> TensorFlowBackend:
        """A backend with ``version`` loaded (:meth:`load`); raises as it does."""
        backend = cls(config, version, lanes, devices, features)
        backend.load()
        return backend

    def load(self) -> None:
        """Import the SavedModel's graph into a new Session with one inter-op pool per lane,
        restore its weights (or serve its lookups from the feature store), build the lane graphs
        and pin the pools. Raises ConfigError (custom op libraries), NotFound (the signature),
        Internal (a broken model or checkpoint), having closed what it opened."""
        tf = _tf()
        from tensorflow.python.saved_model import loader_impl

        config, version, lanes, features = self._config, self._version, self.lanes, self._features
        session_config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=config.intra_op_parallelism_threads,
            inter_op_parallelism_threads=config.inter_op_parallelism_threads,
            allow_soft_placement=True,
        )
        device_plan.configure_tf_gpus(session_config, self._devices, config.session_num)
        device_plan.configure_tf_cpus(session_config, self._devices)
        per_lane_pools = config.use_per_session_threads
        if per_lane_pools:
            for _ in range(lanes):
                session_config.session_inter_op_thread_pool.add(
                    num_threads=config.inter_op_parallelism_threads)
        # Loads and deltas run on their own process-wide pool, never on a serving lane's.
        update_pool = 0
        if config.model_update_inter_threads:
            update_pool = len(session_config.session_inter_op_thread_pool)
            session_config.session_inter_op_thread_pool.add(
                num_threads=config.model_update_inter_threads, global_name=UPDATE_POOL_NAME)
        self._update_options = tf.compat.v1.RunOptions(inter_op_thread_pool=update_pool)
        if config.enable_inline_execute:
            pools = [-1] * lanes
        elif per_lane_pools:
            pools = list(range(lanes))
        else:
            pools = [0] * lanes
        self._run_options = [tf.compat.v1.RunOptions(inter_op_thread_pool=p) for p in pools]

        # before the graph is imported: its custom ops must be registered (ConfigError if not)
        self._op_libraries = op_libraries.load(config.custom_op_libraries)
        try:
            loader = loader_impl.SavedModelLoader(version.savedmodel_dir)
            meta_graph = loader.get_meta_graph_def_from_tags(SERVE_TAGS)
        except (OSError, RuntimeError, ValueError) as exc:
            raise Internal(f"cannot read SavedModel in {version.savedmodel_dir!r}: {exc}") from exc
        sig_def = meta_graph.signature_def.get(config.signature_name)
        if sig_def is None:
            available = sorted(k for k in meta_graph.signature_def if not k.startswith("__"))
            raise NotFound(f"signature_name {shorten(config.signature_name)} not in the SavedModel; "
                           f"available: {shorten(available, 400)}")
        self.signature = signature_from_def(config.signature_name, sig_def)
        # Every signature of the meta graph is served (TF Serving's rule), ``__``-named internals
        # (TF2's __saved_model_init_op) aside; with a feature store only the default one (the
        # lookups are wired into its outputs alone).
        self.signatures = {name: signature_from_def(name, d) for name, d in sorted(meta_graph.signature_def.items())
                           if not name.startswith("__") and features is None}
        self.signatures[config.signature_name] = self.signature
        outputs = [s.name for s in self.signature.outputs.values()]
        # Lanes on distinct devices get their own copy of the serving graph (lane_graphs).
        self._lanes = lane_graphs.lane_map(self._devices)
        placement_on = config.enable_device_placement_optimization
        self._pinned = self._devices.on_gpu or self._lanes.replicated
        self._placement, cpu_ops = lane_graphs.place_first_copy(
            meta_graph, outputs, self._lanes, placement_on, self._pinned)

        self._graph = tf.Graph()
        with pinning.creation_lock, pinning.new_threads() as created:
            self._session = tf.compat.v1.Session(graph=self._graph, config=session_config)
        try:
            with self._graph.as_default():
                loader.load_graph(self._graph, SERVE_TAGS)
                saver_def = meta_graph.saver_def
                if not saver_def.restore_op_name:
                    raise Internal("the SavedModel has no saver_def; cannot restore its parameters")
                prefix = version.full_prefix or os.path.join(version.savedmodel_dir, "variables", "variables")
                # Embedding lookups served from a FeatureStore: their tables are never restored here.
                self._embedding, self._embedding_report = embedding_lookup.attach(
                    self._graph, self._session, meta_graph, outputs, prefix, version, features,
                    row_versions=config.row_ttl_steps is not None)
                if self._embedding is None and config.row_ttl_steps is not None:
                    raise ConfigError("row_ttl_steps: needs the embedding tables in the DRAM or DRAM+SSD store "
                                      "(ev_storage_type 1 or 12, or an EmbeddingVariable checkpoint); TensorFlow "
                                      "variables keep no row's step")
                if self._embedding is None:
                    self._session.run(saver_def.restore_op_name, {saver_def.filename_tensor_name: prefix},
                                      options=self._update_options)
                    loader.run_init_ops(self._session, SERVE_TAGS)
                    restored = restored_variables(self._graph, self._session)
                    check_outputs_restored(self._graph, restored, outputs, version.savedmodel_dir)
            self._updater = VariableUpdater(self._graph, self._session, self._update_options)
            if self._embedding is not None:
                tables = {lk.table for lk in self._embedding.lookups}
                dense = [n for n in self._updater.variables if n not in tables]
                self._updater.apply(Delta(-1, dense=embedding_lookup.dense_values(prefix, dense)))
                with self._graph.as_default():
                    loader.run_init_ops(self._session, SERVE_TAGS)
                # the store-served tables are never restored: only the variables holding a value count
                restored = restored_variables(self._graph, self._session)
            self._weights = variable_bytes(self._graph, self._session, restored)
            if self._lanes.replicated:
                keys = self._embedding.key_tensor_names if self._embedding is not None else []
                self._lanes = lane_graphs.import_copies(self._graph, self._lanes, outputs, keys, cpu_ops, placement_on)
        except ProcessorError:
            self.close()
            raise
        except Exception as exc:  # TF raises many types for a broken model or checkpoint
            self.close()
            source = version.full_prefix or version.savedmodel_dir
            raise Internal(f"loading {source!r} failed: {type(exc).__name__}: {exc}") from exc
        self._feed_tensors = [[self._graph.get_tensor_by_name(c.scope + s.name) for s in self.signature.inputs.values()]
                              for c in self._lanes.copies]
        self._feed_aliases = list(self.signature.inputs)
        self._lane_report = lane_graphs.describe(self._lanes, self._graph, placement_on, self._pinned)
        self._pinning = self._pin(created, per_lane_pools)

    # --- serving ----------------------------------------------------------------------------

    def run(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        fn = self._lane_callables.get((lane, fetches)) or self._make_lane_callable(lane, fetches)
        return self._invoke(fn, [feeds[a] for a in self._feed_aliases])

    def run_signature(self, lane: int, name: str, feeds: dict[str, np.ndarray],
                      fetches: tuple[str, ...]) -> list[np.ndarray]:
        """Run another signature of the model (``signatures[name]``) on ``lane``: its own feeds and
        fetches on the first graph copy (lanes on other devices run it there too), with the lane's
        run options. Same threading and errors as :meth:`run`."""
        key = (lane, name, fetches)
        fn = self._signature_callables.get(key)
        signature = self.signatures[name]
        if fn is None:
            from tensorflow.core.protobuf.config_pb2 import CallableOptions

            options = CallableOptions(feed=[s.name for s in signature.inputs.values()],
                                      fetch=[signature.outputs[a].name for a in fetches],
                                      run_options=self._run_options[lane])
            try:
                made = self._session._make_callable_from_options(options)
            except _tf().errors.OpError as exc:
                raise Internal(f"signature {name!r} cannot run: {exc.message}") from exc
            with self._callables_lock:
                fn = self._signature_callables.setdefault(key, made)
        return self._invoke(fn, [feeds[a] for a in signature.inputs])

    def _call(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...], options,
              metadata) -> list[np.ndarray]:
        """Run the lane's graph copy with explicit run options and metadata (traced runs)."""
        key = (self._lanes.copy_of_lane[lane], fetches)
        fn = self._callables.get(key) or self._make_callable(key)
        return self._invoke(fn, [feeds[a] for a in self._feed_aliases], options=options, run_metadata=metadata)

    @staticmethod
    def _invoke(fn, args: list[np.ndarray], **kwargs) -> list[np.ndarray]:
        """``fn(*args, **kwargs)``; engine errors become ProcessorErrors (AlreadyExists passes)."""
        tf = _tf()
        try:
            return fn(*args, **kwargs)
        except tf.errors.AlreadyExistsError:
            raise
        except tf.errors.InvalidArgumentError as exc:
            raise InvalidArgument(f"the model rejected the input: {exc.message}") from None
        except tf.errors.OpError as exc:
            raise Internal(f"{type(exc).__name__}: {exc.message}") from exc

    @property
    def serving_graph(self):
        """The graph the lanes run (graph copy 0's tensors unscoped), and whether its
        embedding lookups are served from a feature store (then its runs are split runs)."""
        return self._graph, self._embedding is not None

    def tensor_callable(self, lane: int, feeds: list[str], fetches: list[str]):
        """``fn(arrays) -> outputs``: ``lane``'s graph copy run feeding the tensors ``feeds`` and
        fetching ``fetches`` (names in graph copy 0; any tensors: TensorFlow skips the ops that
        fed tensors make unnecessary), with the lane's run options, through a C++ callable;
        errors as :meth:`run`'s. Built per call (keep it). For the context partition
        (:mod:`.context`); not for graphs with store-served lookups."""
        from tensorflow.core.protobuf.config_pb2 import CallableOptions

        scope = self._lanes.copies[self._lanes.copy_of_lane[lane]].scope
        options = CallableOptions(feed=[scope + n for n in feeds], fetch=[scope + n for n in fetches],
                                  run_options=self._run_options[lane])
        with self._callables_lock:
            fn = self._session._make_callable_from_options(options)
        invoke = self._invoke
        return lambda args: invoke(fn, args)

    def wire_server(self, codec):
        """None: requests go through the codec and :meth:`run` (the session needs Python)."""
        return None

    def timed_wire_server(self, codec):
        """None, as :meth:`wire_server`."""
        return None

    native_engine = None  # batches run through run(): the session is called from Python

    def run_traced(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]):
        """``run`` with ``FULL_TRACE``: (outputs, EngineTrace holding the serialized StepStats).

        TensorFlow allows one profiling session per process ("Another profiling session
        active"), so traced runs of all models take turns; if something else in the process
        profiles, NotImplementedError sends the request down the untraced path.
        """
        from ...tracing.events import EngineTrace

        tf = _tf()
        options = tf.compat.v1.RunOptions()
        options.CopyFrom(self._run_options[lane])
        options.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
        metadata = tf.compat.v1.RunMetadata()
        try:
            with _TRACE_LOCK:
                outputs = self._call(lane, feeds, fetches, options, metadata)
        except tf.errors.AlreadyExistsError:
            raise NotImplementedError("another TensorFlow profiling session is active") from None
        return outputs, EngineTrace(step_stats=metadata.step_stats.SerializeToString())

    def _make_lane_callable(self, lane: int, fetches: tuple[str, ...]):
        """The request path's callable of ``lane`` for ``fetches``: built once.

        ``Session.make_callable`` with feeds runs the whole ``Session.run`` machinery in Python on
        every call (about half a millisecond of GIL); a callable made from ``CallableOptions``
        (the C++ ``Session::MakeCallable``, what Keras' TF1 backend used) feeds and fetches in
        C++. Models with a feature store get the same for both runs of their split run.
        """
        key = (lane, fetches)
        copy = self._lanes.copy_of_lane[lane]
        scope = self._lanes.copies[copy].scope
        if self._embedding is not None:
            tensors = [self._graph.get_tensor_by_name(scope + self.signature.outputs[a].name) for a in fetches]
            with self._callables_lock:
                fn = self._embedding.make_callable(tensors, self._feed_tensors[copy], scope,
                                                   run_options=self._run_options[lane])
        else:
            from tensorflow.core.protobuf.config_pb2 import CallableOptions

            callable_options = CallableOptions(
                feed=[t.name for t in self._feed_tensors[copy]],
                fetch=[scope + self.signature.outputs[a].name for a in fetches],
                run_options=self._run_options[lane])
            fn = self._session._make_callable_from_options(callable_options)
        with self._callables_lock:
            return self._lane_callables.setdefault(key, fn)

    def _make_callable(self, key: tuple[int, tuple[str, ...]]):
        """The callable of one graph copy (the lane's) for ``fetches``: built once."""
        with self._callables_lock:
            fn = self._callables.get(key)
            if fn is None:
                copy, fetches = key
                scope, feeds = self._lanes.copies[copy].scope, self._feed_tensors[copy]
                tensors = [self._graph.get_tensor_by_name(scope + self.signature.outputs[a].name) for a in fetches]
                if self._embedding is not None:
                    fn = self._embedding.make_callable(tensors, feeds, scope)
                else:
                    fn = self._session.make_callable(tensors, feeds, accept_options=True)
                self._callables[key] = fn
        return fn

    # --- parameter updates ------------------------------------------------------------------

    @property
    def variables(self) -> dict[str, VariableInfo]:
        """The model's variables by checkpoint name: what a delta may update."""
        return self._updater.variables

    def apply_delta(self, delta: Delta) -> None:
        """Write a checked delta into the live weights, in one run on the update pool.

        Rows of store-served tables go to the FeatureStore (rows held in this process; shared
        stores got them in :meth:`stage_delta`), dense values to the session.
        """
        if isinstance(delta, StoreDelta) and self._embedding is not None:
            ttl = self._config.row_ttl_steps
            self._embedding.tables.apply_delta(delta.chunks, delta.step, removed=delta.removed,
                                               **({} if ttl is None else {"expire_before": delta.step - ttl}))
            if delta.dense:
                self._updater.apply(Delta(delta.step, dense=delta.dense))
            return
        self._updater.apply(delta)

    def update_gate(self) -> UpdateGate:
        """This process's gate: its weights (TensorFlow's variables, DRAM store rows) are its own."""
        return UpdateGate()

    def read_delta(self, prefix: str, step: int) -> Delta:
        """Read and check a delta against this model (store-served tables take their own keys)."""
        if self._embedding is None:
            return read_delta(prefix, step, self.variables)
        tables = {lk.table: lk.dim for lk in self._embedding.lookups}
        dense = {n: v for n, v in self.variables.items() if n not in tables}
        delta = read_store_delta(prefix, step, tables, dense)
        delta.prefix = prefix
        return delta

    def stage_delta(self, delta: Delta) -> None:
        """Before :meth:`apply_delta`, off the request path: write rows shared stores hold."""
        if isinstance(delta, StoreDelta) and self._embedding is not None:
            held = getattr(self._embedding.tables, "source", None)
            source = replace(held, delta_prefix=delta.prefix, delta_step=delta.step) if held is not None else None
            self._embedding.tables.stage_delta(delta.chunks, delta.step, source, removed=delta.removed)

    # --- facts ------------------------------------------------------------------------------

    def memory(self) -> dict[str, int]:
        """The bytes this version holds, by part (:data:`processor.memory.PARTS`, all present):
        ``weights`` (``device`` where a variable asks for a GPU), the graph's variables holding
        a value as loaded, shape x dtype size each (counted once at load: :func:`.variables
        .variable_bytes`; the graph, its constants, lookup tables and TensorFlow's own runtime
        are not counted); ``tables`` / ``caches`` / ``shared``, what the feature store holds for
        this version (:meth:`~processor.features.feature_store.VersionTables.memory`). Cheap."""
        embedding = self._embedding
        tables = embedding.tables if embedding is not None else None
        return memory_parts(self._weights, tables.memory() if tables is not None else {})

    def _pin(self, created: dict[int, str], per_lane_pools: bool) -> dict[str, Any]:
        cpusets = self._config.cpusets
        report: dict[str, Any] = {
            "intra_op_pool": "process-wide, shared by all lanes; not pinned",
            "lanes": [],
        }
        if not cpusets:
            report["summary"] = "no cpusets configured; nothing pinned"
            return report
        if not per_lane_pools:
            report["summary"] = ("cpusets ignored: pinning needs use_per_session_threads "
                                 "(lanes share the process-wide inter-op pool)")
            return report
        pinning.check_cpus(cpusets)
        for lane, cpus in enumerate(cpusets):
            tids = [tid for tid, name in created.items() if name == f"tf_Compute{lane}"]
            pinned = pinning.pin(tids, cpus)
            report["lanes"].append({"lane": lane, "cpus": list(cpus), "pool": f"inter-op pool {lane}",
                                    "threads_pinned": len(pinned)})
        inline = self._config.enable_inline_execute
        report["summary"] = (
            "inter-op pool threads pinned per lane" +
            ("; inline execution runs ops on the calling thread, which is not pinned" if inline else ""))
        return report

    def describe(self) -> dict[str, Any]:
        tf = _tf()
        opts = self._run_options
        return {
            "engine": "tensorflow",
            "engine_version": tf.__version__,
            # oneDNN's allocator keeps what it allocated; off, an unload returns memory (tensorflow_env)
            "onednn": tensorflow_env.onednn_enabled(),
            "lanes": self.lanes,
            "weights": "one Session: one copy of every parameter for all lanes (and all graph copies)"
                       + ("; with workers > 1 each worker process restores its own copy (TensorFlow's "
                          "variables cannot live in shared memory; the ONNX Runtime backend's can)"
                          if shared_segments.active() is not None else ""),
            "inter_op_pool_per_lane": [o.inter_op_thread_pool for o in opts],
            "inter_op_parallelism_threads": self._config.inter_op_parallelism_threads,
            "intra_op_parallelism_threads": self._config.intra_op_parallelism_threads,
            "update_pool": (f"{self._config.model_update_inter_threads} inter-op threads of its own"
                            if self._config.model_update_inter_threads else "the session's default pool")
                           + "; intra-op work shares the process-wide pool",
            "pinning": self._pinning,
            "devices": {**self._devices.describe(), "lane_graphs": self._lane_report},
            "device_placement": self._placement,
            "embedding": self._embedding.describe() if self._embedding is not None else self._embedding_report,
            "signatures": sorted(self.signatures),
            "custom_op_libraries": self._op_libraries,
        }

    def close(self) -> None:
        embedding, self._embedding = self._embedding, None
        if embedding is not None:
            embedding.close()
        session, self._session = self._session, None
        if session is not None:
            session.close()
        self._callables = {}
        self._lane_callables = {}
        self._signature_callables = {}
