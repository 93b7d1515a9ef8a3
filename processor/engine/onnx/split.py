"""Device placement on ONNX Runtime: a cached graph split at its embedding lookups.

The ONNX counterpart of :mod:`processor.engine.tensorflow.placement` (which plans a TensorFlow GraphDef):

* a lookup is a ``Gather`` (axis 0) whose data is a 2-D initializer, an embedding table;
* the embedding part holds the lookups and every ancestor of their ids (hashing, ``Mod``,
  ``Cast``, ``Split``...) up to the graph inputs: it runs in a CPU session beside the tables;
* the dense part is every other node: it runs in the lane's session (on the GPU when the lane
  has one), fed by the lookups' results (the boundary tensors) and the inputs it reads itself.

Nodes without inputs (``Constant``) are copied into each part that reads them, initializers
likewise (a parameter both parts read is held in both places). Graphs with control flow
(subgraph attributes) or without lookups are not split; :func:`split_at_lookups` says why.
The two parts are written next to the cache entry's ``model.onnx`` (same directory, so their
external data references to ``weights.bin`` stay valid), atomically; every parameter is added
as an initializer anyway, so ``weights.bin`` is never read through them.

:class:`SplitGraph.run` runs the two parts: the embedding part's outputs feed the dense part.
Functions and frozen data only; thread-safe.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EMBEDDING_FILE, DENSE_FILE = "split_embedding.onnx", "split_dense.onnx"


@dataclass(frozen=True)
class SplitGraph:
    """The two parts of a split graph and what flows between them."""

    embedding_path: str
    dense_path: str
    tables: tuple[str, ...]  # initializer names of the embedding tables
    lookups: int
    embedding_inputs: tuple[str, ...]  # graph inputs the embedding part reads
    dense_inputs: tuple[str, ...]  # graph inputs the dense part reads
    boundary: tuple[str, ...]  # tensors the embedding part computes for the dense part
    embedding_outputs: tuple[str, ...]  # graph outputs the embedding part computes itself
    embedding_parameters: frozenset[str]  # initializers each part reads
    dense_parameters: frozenset[str]
    embedding_nodes: int
    dense_nodes: int

    def run(self, embedding_run, dense_run, outputs: list[str], feeds: dict[str, Any], _options=None) -> list[Any]:
        """``outputs`` of the whole graph for ``feeds``, from the two parts' binding
        ``run(names, feeds, run_options)``; the signature of such a run itself."""
        first_names = [*self.boundary, *(o for o in outputs if o in self.embedding_outputs)]
        first = dict(zip(first_names, embedding_run(first_names, {n: feeds[n] for n in self.embedding_inputs}, None)))
        dense_outputs = [o for o in outputs if o not in self.embedding_outputs]
        if dense_outputs:
            second_feeds = {n: feeds[n] for n in self.dense_inputs}
            second_feeds.update((n, first[n]) for n in self.boundary)
            first.update(zip(dense_outputs, dense_run(dense_outputs, second_feeds, None)))
        return [first[o] for o in outputs]

    def describe(self) -> dict[str, Any]:
        return {"embedding_tables": list(self.tables), "lookups": self.lookups,
                "embedding_nodes": self.embedding_nodes, "dense_nodes": self.dense_nodes,
                "boundary_tensors": len(self.boundary),
                "embedding_inputs": list(self.embedding_inputs), "dense_inputs": list(self.dense_inputs)}


def split_at_lookups(model_path: str) -> SplitGraph | str:
    """Split the cached model at ``model_path``; a SplitGraph, or the reason it cannot be split."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return "the graph has control flow (If/Loop/Scan): not split"
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    producer = {out: index for index, node in enumerate(graph.node) for out in node.output}

    lookups = [(i, n) for i, n in enumerate(graph.node)
               if n.op_type == "Gather" and len(n.input) == 2 and _axis(n) == 0
               and n.input[0] in initializers and len(initializers[n.input[0]].dims) == 2]
    if not lookups:
        return "no embedding lookups (Gather of a 2-D initializer) in the graph: not split"
    embedding: set[int] = set()
    stack = [i for i, _ in lookups]
    while stack:
        index = stack.pop()
        if index in embedding:
            continue
        embedding.add(index)
        stack.extend(producer[ref] for ref in graph.node[index].input if ref in producer)
    constants = {i for i, n in enumerate(graph.node) if not n.input}
    embedding -= constants
    dense = [i for i in range(len(graph.node)) if i not in embedding and i not in constants]
    if not dense:
        return "every node is part of the embedding lookups; nothing dense to place: not split"

    outputs = [o.name for o in graph.output]
    embedding_made = {out for i in embedding for out in graph.node[i].output}
    dense_reads = [ref for i in dense for ref in graph.node[i].input if ref]
    boundary = tuple(dict.fromkeys(r for r in dense_reads if r in embedding_made))
    embedding_outputs = tuple(o for o in outputs if o in embedding_made)
    if any(o not in embedding_made and o not in producer for o in outputs):
        return "a graph output is not computed by a node: not split"

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    missing = [b for b in boundary if b not in types or not types[b].type.tensor_type.elem_type]
    if missing:
        return f"no type known for the lookups' result(s) {missing[:3]}: not split"

    def part(indices: list[int], outs: list[str], extra_inputs: tuple[str, ...], name: str):
        nodes = [graph.node[i] for i in indices]
        reads = {ref for n in nodes for ref in n.input if ref}
        kept_constants = [graph.node[i] for i in sorted(constants) if set(graph.node[i].output) & reads]
        return sub_model(model, inferred, types, [*kept_constants, *nodes], extra_inputs, outs, name)

    first = part(sorted(embedding), [*boundary, *embedding_outputs], (), "embedding")
    second = part(dense, [o for o in outputs if o not in embedding_made], boundary, "dense")
    directory = Path(model_path).parent
    try:
        paths = [write_beside(directory, EMBEDDING_FILE, first), write_beside(directory, DENSE_FILE, second)]
    except OSError as exc:
        return f"the parts cannot be written next to {model_path}: {exc}: not split"

    def reads_of(part_model) -> frozenset[str]:
        return frozenset(t.name for t in part_model.graph.initializer)

    def inputs_of(part_model, skip: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(i.name for i in part_model.graph.input if i.name not in skip)

    return SplitGraph(paths[0], paths[1], tuple(dict.fromkeys(n.input[0] for _, n in lookups)), len(lookups),
                      inputs_of(first, ()), inputs_of(second, boundary), boundary, embedding_outputs,
                      reads_of(first), reads_of(second), len(embedding), len(dense))


def sub_model(model, inferred, types: dict[str, Any], nodes: list, extra_inputs: tuple[str, ...] | list[str],
              outs: list[str], name: str):
    """A model of ``nodes`` (of ``model``'s graph, in topological order) computing ``outs``:
    its inputs are the graph inputs the nodes read plus ``extra_inputs`` (tensors another part
    computes), its initializers those the nodes read (external data references kept, so it must
    be written beside ``model``); ``types``: value infos by tensor name (of ``inferred``, the
    shape-inferred model)."""
    import onnx

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    reads = {ref for n in nodes for ref in n.input if ref}
    made = {out for n in nodes for out in n.output}
    inputs = [i for i in graph.input if i.name not in initializers and i.name in reads]
    inputs += [types[b] for b in extra_inputs]
    sub = onnx.helper.make_graph(
        nodes, name, inputs, [types[o] if o in types else _by_name(graph.output, o) for o in outs],
        [initializers[r] for r in sorted(reads) if r in initializers and r not in made])
    sub.value_info.extend(v for v in inferred.graph.value_info if v.name in made and v.name not in outs)
    return onnx.helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version,
                                  producer_name="serving-processor split")


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _by_name(values, name: str):
    return next(v for v in values if v.name == name)


def write_beside(directory: Path, filename: str, model) -> str:
    """Write ``model`` to ``directory/filename`` atomically (concurrent writers write the same bytes)."""
    fd, temp = tempfile.mkstemp(prefix=f".{filename}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(temp, directory / filename)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return str(directory / filename)
