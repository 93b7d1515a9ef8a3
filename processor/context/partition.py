"""The context part of a graph: what depends only on the context inputs (and the weights) through
row-wise ops, and where it meets the rest (the boundary). Engine-neutral: the engines describe
their graphs as :class:`Node` lists with :class:`Facts` (static shapes, small constant values),
and :mod:`.rules` says which ops are row-wise.

Why row-wise matters. The context part runs once, at batch 1, on the one-row context; its
results (the boundary tensors) are then repeated to N rows where the rest of the model reads
them. That is exactly the tiled request's answer only if each of the part's results, on the
tiled request, would hold the batch-1 result in every row: true of ops that compute each row
from that row alone (element-wise ops against weights, an embedding lookup of ids, a matrix
product by a weight, a reduction or concatenation over other axes, a reshape keeping the rows).
An op that mixes rows (a reduction over the batch, a reshape across it, the shape of a tensor)
ends the part; what comes after it reads the context inputs repeated to N rows (still exact, just
not computed once). So the rule is conservative: an op not known to be row-wise is not.

Tensor kinds, in topological order over the nodes the outputs need:

* *weight*: an initializer or constant, or the output of a node whose inputs are all weights
  (a variable read); volatile ops (random numbers) never are;
* *context*: a context input, or the output of a row-wise node with at least one context input
  whose other inputs are weights;
* *other*: everything else (it depends on a per-candidate input, or is not row-wise).

The boundary: context tensors made by a node (not the inputs themselves) that an *other* node
or a graph output reads. The rest of the model (the main part) is what the remaining outputs
need, cut at the boundary; it also reads the context inputs it uses directly (then repeated).
Pure functions over frozen data; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

WEIGHT, CONTEXT, OTHER = 0, 1, 2

_MAX_STOPS = 12  # nodes where the context part stopped, reported in model info


@dataclass(frozen=True, eq=False)
class Node:
    """One node (op) of a graph: its inputs and outputs are tensor names ("" for an absent
    optional input); ``controlled``: it has control inputs (never in the context part)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    controlled: bool = False


class Facts(Protocol):
    """What the rules read of a graph besides its nodes."""

    def shape(self, tensor: str) -> tuple[int | None, ...] | None:
        """The static shape (None for an unknown dimension), or None for an unknown rank."""
        ...

    def value(self, tensor: str) -> np.ndarray | None:
        """The value of a small constant tensor (shapes, axes), or None."""
        ...


# rowwise(node, facts, is_context) -> bool; work(node, facts) -> estimated operations per row
RowwiseRule = Callable[[Node, Facts, Callable[[str], bool]], bool]
WorkRule = Callable[[Node, Facts], float]


@dataclass(frozen=True)
class Partition:
    """The context part of a graph (see the module doc)."""

    context_inputs: tuple[str, ...]  # graph input tensors of the context
    boundary: tuple[str, ...]  # what the context part computes for the rest (context outputs included)
    context_outputs: tuple[str, ...]  # graph outputs the context part computes whole
    direct_inputs: tuple[str, ...]  # context inputs the main part reads itself (repeated to N rows)
    context_nodes: tuple[str, ...]  # the nodes the context part runs (weights it needs included)
    main_nodes: tuple[str, ...]  # the nodes the main part runs
    context_node_count: int  # context-kind nodes (weight reads not counted)
    model_node_count: int  # nodes the outputs need, weight reads not counted
    work_share: float  # the context nodes' estimated work per row over the whole model's
    stops: tuple[dict[str, str], ...]  # where the context part stopped, and why

    def describe(self) -> dict[str, Any]:
        return {"boundary_tensors": list(self.boundary), "context_outputs": list(self.context_outputs),
                "context_inputs_read_by_main_part": list(self.direct_inputs),
                "context_nodes": self.context_node_count, "model_nodes": self.model_node_count,
                "work_share_estimate": round(self.work_share, 4),
                "stopped_at": list(self.stops)}


def find_partition(nodes: Sequence[Node], inputs: Sequence[str], context: Sequence[str], weights: set[str],
                   outputs: Sequence[str], facts: Facts, rowwise: RowwiseRule, work: WorkRule,
                   weight_sources: frozenset[str], volatile: Callable[[str], bool]) -> Partition | str:
    """The context part of the graph (``inputs``: its input tensors, ``context`` those of the
    context; ``weights``: initializer / constant tensors; ``weight_sources``: op types of nodes
    without inputs that are weights; ``volatile(op)``: ops whose result varies from run to run),
    or a sentence saying why there is none."""
    producer: dict[str, Node] = {}
    for node in nodes:
        for out in node.outputs:
            if out:
                producer[out] = node
    graph_inputs = set(inputs)
    if any(o in graph_inputs for o in outputs):
        return "a graph output is one of its inputs: not partitioned"
    order = _needed(outputs, producer, graph_inputs)
    if isinstance(order, str):
        return order
    kind: dict[str, int] = {t: (CONTEXT if t in context else OTHER) for t in inputs}
    kind.update((t, WEIGHT) for t in weights if t not in graph_inputs)
    node_kind: dict[str, int] = {}
    stops: list[dict[str, str]] = []

    def is_context(tensor: str) -> bool:
        return kind.get(tensor) == CONTEXT

    for node in order:
        kinds = [kind.get(t, OTHER) for t in node.inputs if t]
        if not kinds:
            k = WEIGHT if node.op in weight_sources else OTHER
        elif node.controlled or volatile(node.op):
            k = OTHER
        elif all(x == WEIGHT for x in kinds):
            k = WEIGHT
        elif CONTEXT in kinds and OTHER not in kinds and rowwise(node, facts, is_context):
            k = CONTEXT
        else:
            k = OTHER
            if CONTEXT in kinds and len(stops) < _MAX_STOPS:
                stops.append({"node": node.name, "op": node.op,
                              "why": "reads per-candidate tensors" if OTHER in kinds and not node.controlled
                              else "not known to be row-wise here" if not node.controlled
                              else "has control inputs"})
        node_kind[node.name] = k
        for out in node.outputs:
            kind[out] = k

    boundary: list[str] = []
    seen: set[str] = set()
    direct: list[str] = []
    for node in order:
        if node_kind[node.name] != OTHER:
            continue
        for t in node.inputs:
            if t and kind.get(t) == CONTEXT and t not in seen:
                seen.add(t)
                (direct if t in graph_inputs else boundary).append(t)
    context_outputs = [o for o in outputs if kind.get(o) == CONTEXT]
    for o in context_outputs:
        if o not in seen:
            seen.add(o)
            boundary.append(o)
    if not boundary:
        return "no part of the model depends on the context inputs alone through row-wise ops"
    main_outputs = [o for o in outputs if o not in context_outputs]
    main = _reach(main_outputs, producer, graph_inputs | set(boundary))
    ctx_part = _reach(boundary, producer, graph_inputs)
    counted = [n for n in order if node_kind[n.name] != WEIGHT]
    context_nodes = [n for n in counted if node_kind[n.name] == CONTEXT]
    total = sum(work(n, facts) for n in counted)
    share = sum(work(n, facts) for n in context_nodes) / total if total > 0 else 0.0
    main_names = {n.name for n in main}
    return Partition(
        tuple(context), tuple(boundary), tuple(context_outputs),
        tuple(t for t in direct if any(t in n.inputs for n in main)),
        tuple(n.name for n in ctx_part), tuple(n.name for n in order if n.name in main_names),
        len(context_nodes), len(counted), share, tuple(stops))


def _needed(outputs: Sequence[str], producer: dict[str, Node], stop: set[str]) -> list[Node] | str:
    """The nodes ``outputs`` need, in topological order (inputs first); a sentence for a cycle."""
    order: list[Node] = []
    state: dict[str, int] = {}  # node name -> 1 visiting, 2 done
    for out in outputs:
        root = producer.get(out)
        if root is None or out in stop or state.get(root.name) == 2:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        state[root.name] = 1
        while stack:
            node, i = stack.pop()
            if i < len(node.inputs):
                stack.append((node, i + 1))
                t = node.inputs[i]
                child = producer.get(t) if t and t not in stop else None
                if child is None:
                    continue
                s = state.get(child.name)
                if s == 1:
                    return "the graph has a cycle (control flow): not partitioned"
                if s is None:
                    state[child.name] = 1
                    stack.append((child, 0))
            else:
                state[node.name] = 2
                order.append(node)
    return order


def _reach(tensors: Sequence[str], producer: dict[str, Node], stop: set[str]) -> list[Node]:
    """The nodes computing ``tensors`` back to ``stop`` tensors (any order)."""
    found: dict[str, Node] = {}
    stack = [t for t in tensors if t not in stop]
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in found:
            continue
        found[node.name] = node
        stack.extend(t for t in node.inputs if t and t not in stop)
    return list(found.values())
