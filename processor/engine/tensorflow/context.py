"""The context part on TensorFlow: two runs of the one Session (issue 47; :mod:`processor.context`).

A Session accepts feeds of intermediate tensors, and then skips the ops that only computed them.
So no graph is rewritten: :func:`open_context_part` finds the partition of the serving graph
(:func:`processor.context.partition.find_partition` with the TensorFlow rules), and a broadcast
request runs a callable that feeds the context inputs (one row) and fetches the boundary
tensors, then one that feeds the per-candidate inputs, the boundary tensors repeated to N rows
(and any context input the rest reads itself, repeated) and fetches the outputs: the context ops
do not run again. Both are C++ callables on the request's lane with its run options
(:meth:`~.backend.TensorFlowBackend.tensor_callable`), over the one set of variables
(deltas reach both runs).

Not partitioned (the report says why; broadcast requests are then tiled): a graph whose lookups
a feature store serves (its runs are already split runs), one where nothing row-wise depends on
the context alone. Control dependencies are respected: an op with control inputs, or that other
ops wait for, never joins the context part. Thread-safe after construction.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ...context.partition import Node, Partition, find_partition
from ...context.rules import TF_WEIGHT_SOURCES, tf_rowwise, tf_volatile, tf_work

_SMALL = 64  # constants read for the rules (shapes, axes) have at most this many elements
# the attributes the rules read, by op type (processor/context/rules.py)
_ATTRS = {"MatMul": ("transpose_a", "transpose_b"), "BatchMatMul": ("adj_x", "adj_y"),
          "BatchMatMulV2": ("adj_x", "adj_y"), "BatchMatMulV3": ("adj_x", "adj_y"), "GatherV2": ("batch_dims",),
          "ResourceGather": ("batch_dims",), "Squeeze": ("squeeze_dims",)}


class _TfFacts:
    """Static shapes and small constant values of a TensorFlow graph's tensors."""

    def __init__(self, graph) -> None:
        self._graph = graph

    def _tensor(self, name: str):
        try:
            return self._graph.get_tensor_by_name(name)
        except (KeyError, ValueError):
            return None

    def shape(self, tensor: str):
        t = self._tensor(tensor)
        if t is None or t.shape.rank is None:
            return None
        return tuple(t.shape.as_list())

    def value(self, tensor: str):
        from tensorflow.python.framework import tensor_util

        t = self._tensor(tensor)
        if t is None or t.op.type != "Const":
            return None
        value = tensor_util.constant_value(t)
        return value if value is not None and np.size(value) <= _SMALL else None


def _nodes(graph) -> list[Node]:
    """The graph's ops as partition nodes; control edges as pseudo tensors ``^op`` (so both parts
    keep them), and an op other ops wait for marked controlled (never in the context part)."""
    waited = {c.name for op in graph.get_operations() for c in op.control_inputs}
    nodes = []
    for op in graph.get_operations():
        attrs = {}
        for key in _ATTRS.get(op.type, ()):
            try:
                attrs[key] = op.get_attr(key)
            except ValueError:  # an older graph's op without it: the op's default
                pass
        nodes.append(Node(op.name, op.type, (*[t.name for t in op.inputs], *[f"^{c.name}" for c in op.control_inputs]),
                          (*[t.name for t in op.outputs], f"^{op.name}"), attrs,
                          controlled=bool(op.control_inputs) or op.name in waited))
    return nodes


class TfContextPart:
    """The two runs (see the module doc and :class:`processor.context.runner.ContextPart`)."""

    def __init__(self, backend, signature, aliases: frozenset[str], partition: Partition) -> None:
        self._backend = backend
        self._partition = partition
        names = {spec.name: alias for alias, spec in signature.inputs.items()}
        self.context_inputs = aliases
        self.boundary = partition.boundary
        out_alias = {spec.name: alias for alias, spec in signature.outputs.items()}
        self.context_outputs = {out_alias[t]: i for i, t in enumerate(partition.boundary)
                                if t in partition.context_outputs and t in out_alias}
        self.direct_inputs = frozenset(names[t] for t in partition.direct_inputs)
        self._context_aliases = tuple(sorted(aliases))
        self._context_feeds = [signature.inputs[a].name for a in self._context_aliases]
        self._main_aliases = tuple(a for a in signature.inputs if a not in aliases or a in self.direct_inputs)
        self._main_feeds = [signature.inputs[a].name for a in self._main_aliases] + list(partition.boundary)
        self._output_names = {alias: spec.name for alias, spec in signature.outputs.items()}
        self._lock = threading.Lock()
        self._context_runs: dict[int, Any] = {}
        self._main_runs: dict[tuple[int, tuple[str, ...]], Any] = {}

    def run_context(self, lane: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        fn = self._context_runs.get(lane)
        if fn is None:
            made = self._backend.tensor_callable(lane, self._context_feeds, list(self.boundary))
            with self._lock:
                fn = self._context_runs.setdefault(lane, made)
        return fn([feeds[a] for a in self._context_aliases])

    def run_main(self, lane: int, feeds: dict[str, np.ndarray], boundary: list[np.ndarray],
                 fetches: tuple[str, ...]) -> list[np.ndarray]:
        key = (lane, fetches)
        fn = self._main_runs.get(key)
        if fn is None:
            made = self._backend.tensor_callable(lane, self._main_feeds, [self._output_names[a] for a in fetches])
            with self._lock:
                fn = self._main_runs.setdefault(key, made)
        return fn([feeds[a] for a in self._main_aliases] + list(boundary))

    def describe(self) -> dict[str, Any]:
        return {"engine": "tensorflow: one Session, a run fetching the boundary tensors, then a run feeding them",
                "context_inputs": sorted(self.context_inputs), **self._partition.describe()}

    def close(self) -> None:
        self._context_runs = {}
        self._main_runs = {}


def open_context_part(backend, aliases: frozenset[str]) -> tuple[TfContextPart | None, dict[str, Any]]:
    """``backend``'s serving graph partitioned for the context inputs ``aliases``: (the part, a
    report), or (None, a report saying why not)."""
    graph, store_lookups = backend.serving_graph
    if store_lookups:
        return None, {"not_partitioned": "the embedding lookups are served from a feature store (a split run); "
                                         "broadcast requests are tiled"}
    signature = backend.signature
    inputs = [spec.name for spec in signature.inputs.values()]
    context = [signature.inputs[a].name for a in sorted(aliases)]
    partition = find_partition(_nodes(graph), inputs, context, set(), [s.name for s in signature.outputs.values()],
                               _TfFacts(graph), tf_rowwise, tf_work, TF_WEIGHT_SOURCES, tf_volatile)
    if isinstance(partition, str):
        return None, {"not_partitioned": partition + "; broadcast requests are tiled"}
    return TfContextPart(backend, signature, aliases, partition), {}
