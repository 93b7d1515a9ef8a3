"""Serve a TensorFlow graph's embedding lookups from a FeatureStore.

**Finding the lookups.** The embedding layer is found by the device placement analysis
(:func:`processor.engine.tensorflow.placement.plan_placement`: 2-D variables looked up by ``ResourceGather``
/ ``GatherV2`` / ``Gather``, their id preprocessing and combiners); the same analysis drives
``enable_device_placement_optimization``. For each lookup of a table this module records the
gather's output, its indices (the row ids) and, when the indices are ``floormod(x, rows)`` /
``mod(x, rows)`` of an integer tensor reached through shape ops (``Unpack``, ``StridedSlice``,
``Reshape``, ...), the raw ids ``x`` replayed through the same shape ops (new ops added to the
serving graph; the mapping op is left out).

**Keys.** A table whose checkpoint holds a plain ``[rows, dim]`` variable is keyed by row ids; a
table in the EmbeddingVariable export format (``<table>-keys`` / ``-values``) is keyed by raw
ids (ids not in the table get the default vector, as an EmbeddingVariable does).

**Split run.** A request runs in two steps on the same lane: (1) fetch the key tensors of every
lookup, feeding the signature inputs (computed in numpy instead where the ops on the way allow,
see :mod:`.key_replay`); (2) look the keys up in the store (one batched call for
all tables) and run the rest of the graph feeding the looked-up rows as the gathers' outputs
(TensorFlow lets any tensor be fed; the tables are never read). The tables are therefore never
restored into the process: only dense variables are.

Thread-safe after construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import spans
from ...errors import ConfigError
from . import placement
from .key_replay import KeyReplay

_SHAPE_OPS = frozenset({"Identity", "Unpack", "StridedSlice", "Slice", "Reshape", "Squeeze", "ExpandDims",
                        "Cast", "Transpose"})
_MAPPING_OPS = frozenset({"FloorMod", "Mod", "TruncateMod"})
_INT_DTYPES = (3, 9)  # DT_INT32, DT_INT64


@dataclass
class Lookup:
    """One gather into an embedding table."""

    op: str                 # the gather op
    table: str              # the table variable's name (its checkpoint name)
    output: str             # the gather's output tensor, fed in step 2
    indices: str            # the gather's row ids
    raw_ids: str | None     # the raw-id tensor when the row ids are floormod / mod of one
    mapping: str | None     # that floormod / mod op
    dim: int
    keyed_by: str = "row"

    @property
    def key_tensor(self) -> str:
        return self.raw_ids if self.keyed_by == "raw" and self.raw_ids else self.indices


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _tensor(ref: str) -> str:
    ref = ref.lstrip("^")
    return ref if ":" in ref else ref + ":0"


def find_lookups(graph_def, outputs: Sequence[str]) -> tuple[placement.PlacementPlan, list[Lookup]]:
    """The placement plan of the serving part of ``graph_def`` and its table lookups.

    Raises ConfigError for a table that is read other than by a servable lookup.
    """
    wanted = placement.serving_ancestors(graph_def, outputs)
    plan = placement.plan_placement(graph_def, wanted)
    nodes = {n.name: n for n in graph_def.node}
    tables = set(plan.embedding_tables)

    def table_of(ref: str) -> str | None:
        node = nodes.get(_name(ref))
        for _ in range(8):
            if node is None or node.op not in placement._READ_OPS or not node.input:
                break
            node = nodes.get(_name(node.input[0]))
        return node.name if node is not None and node.name in tables else None

    lookups: list[Lookup] = []
    for name in plan.cpu_ops:
        node = nodes[name]
        if node.op not in placement._LOOKUP_OPS or len(node.input) < 2:
            continue
        table = table_of(node.input[0])
        if table is None:
            continue
        if "batch_dims" in node.attr and node.attr["batch_dims"].i != 0:
            raise ConfigError(f"{name}: a gather with batch_dims cannot be served from a feature store")
        if node.op == "GatherV2":
            axis = nodes.get(_name(node.input[2]))
            if axis is None or axis.op != "Const" or _const_int(axis) != 0:
                raise ConfigError(f"{name}: only gathers on axis 0 can be served from a feature store")
        dtype = node.attr["dtype"].type if "dtype" in node.attr else node.attr["Tparams"].type
        if dtype != 1:  # DT_FLOAT
            raise ConfigError(f"{name}: table {table} is not float32; the feature store holds float32 rows")
        shape = nodes[table].attr["shape"].shape
        raw, mapping = _raw_ids(nodes, node.input[1])
        lookups.append(Lookup(name, table, f"{name}:0", _tensor(node.input[1]), raw, mapping,
                              int(shape.dim[1].size)))
    _check_only_lookups_read(graph_def, nodes, wanted, {lk.table for lk in lookups}, {lk.op for lk in lookups})
    return plan, lookups


def _const_int(node) -> int | None:
    t = node.attr["value"].tensor
    vals = list(t.int_val) or list(t.int64_val)
    return vals[0] if vals else None


def _raw_ids(nodes, indices_ref: str) -> tuple[str | None, str | None]:
    """(raw-id tensor, mapping op) when the indices are floormod/mod of integers; else (None, None)."""
    node = nodes.get(_name(indices_ref))
    for _ in range(16):
        if node is None:
            return None, None
        if node.op in _MAPPING_OPS and node.input:
            src = nodes.get(_name(node.input[0]))
            dtype = node.attr["T"].type if "T" in node.attr else None
            if src is None or dtype not in _INT_DTYPES:
                return None, None
            return _tensor(node.input[0]), node.name
        if node.op not in _SHAPE_OPS or not node.input:
            return None, None
        node = nodes.get(_name(node.input[0]))
    return None, None


def _check_only_lookups_read(graph_def, nodes, wanted: set[str], tables: set[str], lookup_ops: set[str]) -> None:
    for n in graph_def.node:
        if n.name not in wanted or n.name in lookup_ops:
            continue
        for ref in n.input:
            src = _name(ref)
            if src in tables and n.op not in placement._READ_OPS:
                raise ConfigError(f"embedding table {src} is read by {n.name} ({n.op}), not only by lookups; "
                                  f"it cannot be served from a feature store")
            node = nodes.get(src)
            if node is not None and node.op in placement._READ_OPS and node.input \
                    and _name(node.input[0]) in tables and n.op not in placement._READ_OPS:
                raise ConfigError(f"embedding table {_name(node.input[0])} is read by {n.name} ({n.op}), "
                                  f"not only by lookups; it cannot be served from a feature store")


def replay_raw_ids(graph, lookup: Lookup) -> str:
    """Add ops computing ``lookup``'s raw ids in the shape of its indices; return the tensor name.

    The path from the mapping op's input to the indices is copied op by op with the mapping op
    left out (its first input taken instead).
    """
    target = graph.get_tensor_by_name(lookup.indices)
    path = []  # (op, output index) from the indices up to the mapping op's consumer
    tensor = target
    while tensor.op.name != lookup.mapping:
        path.append((tensor.op, tensor.value_index))
        tensor = tensor.op.inputs[0]
    current = graph.get_tensor_by_name(lookup.raw_ids)
    if not path:
        return current.name
    with graph.as_default():
        for op, index in reversed(path):
            if op.type in ("Cast", "Identity"):
                continue  # raw ids stay int64: a cast to int32 would cut them
            attrs = dict(op.node_def.attr)
            if "T" in attrs:
                attrs["T"] = _attr_type(current.dtype)
            dtypes = [current.dtype if o.dtype.is_integer else o.dtype for o in op.outputs]
            with graph.device(op.device):  # where the op it replays was placed
                new = graph.create_op(op.type, [current, *op.inputs[1:]], dtypes,
                                      name=f"processor_raw_ids/{op.name}", attrs=attrs)
            current = new.outputs[index]
    return current.name


def needed_feeds(feeds: Sequence[Any], fetches: Sequence[Any], fed: Sequence[Any]) -> list[int]:
    """The positions of ``feeds`` (graph tensors) that ``fetches`` depend on, data or control,
    when the tensors in ``fed`` are fed too (what lies behind them is not run)."""
    positions = {t.name: i for i, t in enumerate(feeds)}
    cut = {t.name for t in fed}
    needed: set[int] = set()
    seen: set[str] = set()
    stack = []

    def visit(tensor) -> None:
        if tensor.name in positions:
            needed.add(positions[tensor.name])
        elif tensor.name not in cut and tensor.op.name not in seen:
            seen.add(tensor.op.name)
            stack.append(tensor.op)

    for tensor in fetches:
        visit(tensor)
    while stack:
        op = stack.pop()
        for tensor in op.inputs:
            visit(tensor)
        for control in op.control_inputs:
            if control.name not in seen:
                seen.add(control.name)
                stack.append(control)
    return sorted(needed)


def _attr_type(dtype):
    from tensorflow.core.framework import attr_value_pb2

    return attr_value_pb2.AttrValue(type=dtype.as_datatype_enum)


class EmbeddingService:
    """Serves ``lookups`` of a loaded graph from ``tables`` by the split run (see the module doc)."""

    def __init__(self, graph, session, lookups: list[Lookup], tables, plan_report: dict[str, Any]) -> None:
        self.lookups = lookups
        self.tables = tables
        self.plan_report = plan_report
        self._graph = graph
        self._session = session
        for lk in lookups:
            if lk.keyed_by == "raw" and lk.raw_ids and lk.mapping:
                lk.raw_ids = replay_raw_ids(graph, lk)
        self.key_tensor_names = list(dict.fromkeys(lk.key_tensor for lk in lookups))
        self._key_index = [self.key_tensor_names.index(lk.key_tensor) for lk in lookups]
        self._phase1: dict[str, Any] = {}  # by graph-copy scope (see lane_graphs)
        self.keys_replayed: bool | None = None  # whether the request path computes keys in numpy

    def make_callable(self, fetch_tensors, feed_tensors, scope: str = "", run_options=None):
        """A callable like ``Session.make_callable(fetches, feeds, accept_options=True)``'s.

        ``scope``: the name prefix of the lane's graph copy whose key tensors and gathers to use
        (``""``: the imported graph). ``run_options`` (a lane's RunOptions): both runs are
        callables made from ``CallableOptions`` with those options, feeding and fetching in
        C++ (``Session.make_callable``'s feeds cost about half a millisecond of Python a run,
        twice per request here); the callable then takes the feeds only. None: runs take
        ``options`` and ``run_metadata`` per call (traced runs). Not thread-safe: the backend
        builds callables under a lock.
        """
        graph = self._graph
        keys = [graph.get_tensor_by_name(scope + n) for n in self.key_tensor_names]
        gathered = [graph.get_tensor_by_name(scope + lk.output) for lk in self.lookups]
        # each run is fed only the inputs it reads (a string input costs a conversion a run)
        first = needed_feeds(feed_tensors, keys, ())
        second = needed_feeds(feed_tensors, fetch_tensors, gathered)
        if run_options is None:
            phase1 = self._phase1.get(scope)
            if phase1 is None:
                phase1 = self._phase1[scope] = self._session.make_callable(
                    keys, [feed_tensors[i] for i in first], accept_options=True)
            phase2 = self._session.make_callable(fetch_tensors, [feed_tensors[i] for i in second] + gathered,
                                                 accept_options=True)
        else:
            # the keys computed in numpy where the graph part allows it (key_replay), else a run
            phase1 = (KeyReplay.build([feed_tensors[i] for i in first], keys)
                      or self._from_options(keys, [feed_tensors[i] for i in first], run_options))
            self.keys_replayed = isinstance(phase1, KeyReplay)
            phase2 = self._from_options(fetch_tensors, [feed_tensors[i] for i in second] + gathered, run_options)
        lookups, key_index, tables = self.lookups, self._key_index, self.tables
        fixed = run_options is not None

        def run(*feeds, options=None, run_metadata=None):
            given = [feeds[i] for i in first]
            keys = phase1(*given) if fixed else phase1(*given, options=options)
            # rows come in the keys' shape + [dim]: the gathers' outputs, fed as they are
            with spans.stage("feature_store.lookup"):  # a sampled request's span (StoreMetrics fills it)
                gathered = tables.lookup([(lk.table, keys[i]) for lk, i in zip(lookups, key_index)])
            given = [feeds[i] for i in second]
            if fixed:
                return phase2(*given, *gathered)
            if run_metadata is None:
                return phase2(*given, *gathered, options=options)
            return phase2(*given, *gathered, options=options, run_metadata=run_metadata)

        return run

    def _from_options(self, fetches, feeds, run_options):
        """``Session._make_callable_from_options`` (the C++ ``Session::MakeCallable``): called
        with the feeds in order, it returns the fetches."""
        from tensorflow.core.protobuf.config_pb2 import CallableOptions

        options = CallableOptions(feed=[t.name for t in feeds], fetch=[t.name for t in fetches],
                                  run_options=run_options)
        return self._session._make_callable_from_options(options)

    def describe(self) -> dict[str, Any]:
        return {
            "served_from": "feature store",
            "split_run": "1) key tensors  2) store lookup  3) rest of the graph fed the rows",
            "keys": {True: "computed in numpy (key_replay)", False: "a TensorFlow run",
                     None: "not computed yet"}[self.keys_replayed],
            "lookups": [{"op": lk.op, "table": lk.table, "keyed_by": lk.keyed_by, "key_tensor": lk.key_tensor,
                         "id_mapping": lk.mapping, "dim": lk.dim} for lk in self.lookups],
            "placement_analysis": self.plan_report,
            "store": self.tables.describe(),
        }

    def close(self) -> None:
        tables, self.tables = self.tables, None
        if tables is not None:
            tables.release()


def version_id(version) -> str:
    """The store's name of a full version: ``<run>-<full step>`` (``savedmodel`` without one)."""
    import os

    from ...features.key_layout import safe_name

    if version.full_step < 0:
        return "savedmodel"
    run = os.path.basename(str(version.run_dir).rstrip("/")) or "run"
    return safe_name(f"{run}-{version.full_step}")


def attach(graph, session, meta_graph, outputs: Sequence[str], prefix: str, version, features,
           row_versions: bool = False):
    """Serve the graph's lookups from a store when one is configured or the checkpoint needs it.

    Returns ``(service or None, report)``. ``features`` is the model's FeatureStore (None for
    TensorFlow variables); an EmbeddingVariable-format checkpoint with no store configured is
    served from a DRAM store (TensorFlow variables cannot hold it). ``row_versions``: every row
    the store loads gets a version, its checkpoint's step where the checkpoint gives none
    (``row_ttl_steps`` needs one per row).
    """
    from ...features.dram_store import DramStore
    from ...features.ev_checkpoint import CheckpointTables, TableSource
    from ...features.rows import TableSpec

    plan, lookups = find_lookups(meta_graph.graph_def, outputs)
    ckpt = CheckpointTables(prefix)
    ev = ckpt.ev_tables()
    needs_store = sorted(lk.table for lk in lookups if lk.table in ev)
    store = features
    auto = False
    if store is None and needs_store:
        store, auto = DramStore(), True
    if store is None or not lookups:
        if ev and not lookups:
            raise ConfigError(f"the checkpoint holds EmbeddingVariable tables {sorted(ev)} but the graph has no "
                              f"lookup into them")
        report = {"served_from": "tensorflow variables", "tables": plan.embedding_tables,
                  "lookups": [{"op": lk.op, "table": lk.table} for lk in lookups]}
        if store is not None:
            report["note"] = "no embedding lookups found in the graph; the feature store is unused"
        return None, report
    specs: dict[str, TableSpec] = {}
    for lk in lookups:
        layout = ckpt.layout(lk.table, ev)
        if layout is None:
            raise ConfigError(f"the checkpoint {prefix!r} holds no table {lk.table!r}")
        if layout.dim != lk.dim:
            raise ConfigError(f"table {lk.table!r}: the checkpoint's rows have dim {layout.dim}, the graph's {lk.dim}")
        lk.keyed_by = layout.keyed_by
        specs[lk.table] = TableSpec(lk.table, lk.dim, layout.keyed_by, layout.rows, dtype=store.dtype)
    tables = store.open_version(version_id(version), specs,
                                TableSource(prefix, step=version.full_step, stamp_versions=row_versions))
    if hasattr(tables, "filtered"):
        tables.filtered = {t: ev[t].filtered for t in specs if t in ev and ev[t].filtered}
    service = EmbeddingService(graph, session, lookups, tables, plan.describe())
    if auto:
        service.plan_report = {**service.plan_report,
                               "note": "EmbeddingVariable checkpoint: tables served from a DRAM store"}
    return service, None


def dense_values(prefix: str, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The checkpoint values of the dense variables ``names`` (every non-table variable)."""
    from ...checkpoint.delta import CheckpointError
    from ...features.ev_checkpoint import CheckpointTables

    ckpt = CheckpointTables(prefix)
    missing = [n for n in names if n not in ckpt.shapes]
    if missing:
        raise CheckpointError(f"checkpoint {prefix!r} lacks variables {missing[:5]}")
    return {n: ckpt.tensor(n) for n in names}
