"""Device placement analysis: find a recommendation graph's embedding layer; plan CPU vs GPU.

The embedding layer of a CTR model is memory-bound lookups into big tables plus id
preprocessing (hashing strings, ``floormod``, ``Unique``, combiners). On a GPU it wastes device
memory and pays host-device copies for tiny kernels; DeepRec's device placement optimization
keeps it on the CPU and sends only the dense part (MLP) to the GPU. This module decides which
ops those are, from a GraphDef alone (pure; runs and is tested without a GPU):

* embedding tables: 2-D variables (``VarHandleOp`` / ``VariableV2``) that are looked up:
  ``ResourceGather`` on the handle, or ``GatherV2`` / ``Gather`` whose params are a read of it
  (``ReadVariableOp`` / ``Identity``);
* their lookups, those reads, and the handles;
* the id preprocessing: every ancestor of a lookup's indices up to the graph inputs;
* combiners that consume lookups (``SparseSegment*``, ``Segment*``, ``UnsortedSegment*``) and
  their index inputs' ancestors;
* string hashing ops anywhere (``StringToHashBucket*``) and other string ops.

Everything else that computes (not a Placeholder, not a NoOp / init / saver op) is the dense
part and goes to the GPU. :func:`apply_plan` writes the devices into a GraphDef; the backend pins
every lane's graph copy with :func:`processor.engine.tensorflow.lane_graphs.pin`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
_READ_OPS = frozenset({"ReadVariableOp", "Identity"})
_LOOKUP_OPS = frozenset({"ResourceGather", "GatherV2", "Gather"})
_COMBINER_PREFIXES = ("SparseSegment", "Segment", "UnsortedSegment")
_HASH_OPS = frozenset({"StringToHashBucketFast", "StringToHashBucketStrong", "StringToHashBucket"})
_STRING_PREFIXES = ("String", "Substr", "RegexReplace", "StaticRegex", "AsString", "DecodeRaw", "ReduceJoin")
# Ops that neither compute for a request nor belong to a device plan.
_SKIP_OPS = frozenset({"Placeholder", "PlaceholderWithDefault", "NoOp", "SaveV2", "RestoreV2",
                       "MergeV2Checkpoints", "ShardedFilename", "StringJoin", "AssignVariableOp",
                       "VarIsInitializedOp", "Assign"})


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


@dataclass
class PlacementPlan:
    """Which op goes where, and why."""

    embedding_tables: list[str] = field(default_factory=list)
    cpu_ops: list[str] = field(default_factory=list)
    gpu_ops: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # cpu op -> why

    def device_of(self, op: str) -> str | None:
        if op in self._cpu:
            return "CPU"
        if op in self._gpu:
            return "GPU"
        return None

    def __post_init__(self) -> None:
        self._cpu = set(self.cpu_ops)
        self._gpu = set(self.gpu_ops)

    def describe(self, limit: int = 50) -> dict[str, Any]:
        def clip(names: list[str]) -> list[str]:
            return names if len(names) <= limit else [*names[:limit], f"... {len(names) - limit} more"]

        return {
            "embedding_tables": self.embedding_tables,
            "cpu_op_count": len(self.cpu_ops),
            "gpu_op_count": len(self.gpu_ops),
            "cpu_ops": clip(self.cpu_ops),
            "gpu_ops": clip(self.gpu_ops),
        }


def _is_shape_2d(node) -> bool:
    if "shape" not in node.attr:
        return False
    shape = node.attr["shape"].shape
    return not shape.unknown_rank and len(shape.dim) == 2


def plan_placement(graph_def, serving_ops: Iterable[str] | None = None) -> PlacementPlan:
    """Plan the devices of ``graph_def``'s ops (see the module doc).

    ``serving_ops`` limits the plan to these op names (e.g. the ancestors of the signature's
    outputs); by default every op is planned.
    """
    nodes = {n.name: n for n in graph_def.node}
    wanted = set(serving_ops) if serving_ops is not None else set(nodes)
    consumers: dict[str, list] = {}
    for n in graph_def.node:
        for ref in n.input:
            consumers.setdefault(_name(ref), []).append(n)

    def source_variable(ref: str) -> str | None:
        """The variable a lookup's params come from, through reads."""
        node = nodes.get(_name(ref))
        seen = 0
        while node is not None and node.op in _READ_OPS and node.input and seen < 8:
            node = nodes.get(_name(node.input[0]))
            seen += 1
        if node is not None and node.op in _VARIABLE_OPS and _is_shape_2d(node):
            return node.name
        return None

    cpu: dict[str, str] = {}
    tables: list[str] = []

    def mark(name: str, why: str) -> None:
        if name in nodes and name not in cpu:
            cpu[name] = why

    def mark_ancestors(ref: str, why: str) -> None:
        stack = [_name(ref)]
        while stack:
            name = stack.pop()
            node = nodes.get(name)
            if node is None or name in cpu or node.op in ("Placeholder", "PlaceholderWithDefault"):
                continue
            cpu[name] = why
            stack.extend(_name(r) for r in node.input if not r.startswith("^"))

    lookups = []
    for n in graph_def.node:
        if n.op in _LOOKUP_OPS and n.input:
            table = source_variable(n.input[0])
            if table is not None:
                lookups.append((n, table))
    for n, table in lookups:
        if table not in tables:
            tables.append(table)
        mark(n.name, f"lookup into embedding table {table}")
        mark(table, "embedding table")
        read = nodes.get(_name(n.input[0]))
        while read is not None and read.op in _READ_OPS:
            mark(read.name, f"read of embedding table {table}")
            read = nodes.get(_name(read.input[0])) if read.input else None
        if len(n.input) > 1:
            mark_ancestors(n.input[1], f"id preprocessing for {table}")
        if n.op == "GatherV2" and len(n.input) > 2:
            mark(_name(n.input[2]), f"lookup axis for {table}")
        for consumer in consumers.get(n.name, []):
            if consumer.op.startswith(_COMBINER_PREFIXES):
                mark(consumer.name, f"combiner of {table} lookups")
                for ref in consumer.input[1:]:
                    mark_ancestors(ref, f"combiner indices for {table}")
    for n in graph_def.node:
        if n.op in _HASH_OPS:
            mark(n.name, "string hashing")
            for ref in n.input:
                mark_ancestors(ref, "string hashing input")
        elif n.op.startswith(_STRING_PREFIXES):
            mark(n.name, "string op")

    cpu_ops = [n.name for n in graph_def.node if n.name in cpu and n.name in wanted]
    gpu_ops = [n.name for n in graph_def.node
               if n.name not in cpu and n.name in wanted and n.op not in _SKIP_OPS
               and not n.name.startswith(("save/", "init", "report_uninitialized", "processor_delta"))]
    return PlacementPlan(tables, cpu_ops, gpu_ops, {k: v for k, v in cpu.items() if k in wanted})


def serving_ancestors(graph_def, outputs: Iterable[str]) -> set[str]:
    """Names of the ops the given output tensors depend on (inputs and control inputs)."""
    nodes = {n.name: n for n in graph_def.node}
    seen: set[str] = set()
    stack = [_name(o) for o in outputs]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        stack.extend(_name(r) for r in nodes[name].input)
    return seen


def apply_plan(graph_def, plan: PlacementPlan, gpu_device: str, cpu_device: str = "/device:CPU:0") -> int:
    """Set the device of every planned op in ``graph_def`` (in place); return how many were set."""
    count = 0
    for node in graph_def.node:
        where = plan.device_of(node.name)
        if where is not None:
            node.device = cpu_device if where == "CPU" else gpu_device
            count += 1
    return count

