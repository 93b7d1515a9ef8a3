"""The context part on ONNX Runtime: the graph partitioned at load into the part that depends only
on the declared context inputs (run once per request, at batch 1) and the rest (issue 47;
:mod:`processor.context`).

:func:`open_context_part` reads the prepared graph (``model.onnx`` of the cache entry), finds
the partition (:func:`processor.context.partition.find_partition` with the ONNX rules), writes
the two parts beside it (``context_<digest>_part.onnx`` and ``context_<digest>_main.onnx``, as
:mod:`.split` writes its parts: external data references stay valid, every parameter is added as
an initializer anyway) and opens each part as its own sessions over the backend's shared
parameter buffers (:meth:`~.backend.OnnxRuntimeBackend.part_runs`: one copy of the weights,
deltas reach both parts). Parts run through the Python binding (which releases the GIL in Run).

Not partitioned (the report says why; broadcast requests are then tiled): a graph split by device
placement, one with control flow, one where nothing row-wise depends on the context alone.
Thread-safe after construction (ONNX Runtime sessions are).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ...context.partition import Node, Partition, find_partition
from ...context.rules import ONNX_WEIGHT_SOURCES, onnx_rowwise, onnx_volatile, onnx_work
from .ort_errors import engine_error
from .split import sub_model, write_beside

log = logging.getLogger(__name__)

_SMALL = 64  # constants read for the rules (shapes, axes) have at most this many elements
_FETCH_CACHE_SIZE = 64  # output selections remembered (as the backend's)


class _OnnxFacts:
    """Static shapes (from ONNX shape inference) and small constant values of a graph."""

    def __init__(self, model, inferred, read_parameter) -> None:
        from onnx import numpy_helper

        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self._shapes: dict[str, tuple[int | None, ...] | None] = {}
        graph = inferred.graph
        for v in [*graph.input, *graph.output, *graph.value_info]:
            t = v.type.tensor_type
            self._shapes[v.name] = (tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
                                    if t.HasField("shape") else None)
        self._values: dict[str, np.ndarray] = {}
        for init in model.graph.initializer:
            self._shapes[init.name] = tuple(init.dims)
            if int(np.prod(init.dims)) <= _SMALL:
                external = init.data_location == 1  # onnx.TensorProto.EXTERNAL
                try:
                    self._values[init.name] = read_parameter(init.name) if external else numpy_helper.to_array(init)
                except (KeyError, ValueError):
                    pass
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                array = numpy_helper.to_array(node.attribute[0].t)
                self._shapes[node.output[0]] = tuple(array.shape)
                if array.size <= _SMALL:
                    self._values[node.output[0]] = array

    def shape(self, tensor: str):
        return self._shapes.get(tensor)

    def value(self, tensor: str):
        return self._values.get(tensor)


class OrtContextPart:
    """The two parts' sessions (see the module doc and :class:`processor.context.runner.ContextPart`)."""

    def __init__(self, backend, signature, aliases: frozenset[str], partition: Partition,
                 context_runs: list[Any], main_runs: list[Any], part_inputs: tuple[str, ...],
                 main_inputs: frozenset[str], paths: tuple[str, str]) -> None:
        self._backend = backend
        self._partition = partition
        self._context_runs = context_runs
        self._main_runs = main_runs
        self._part_inputs = part_inputs  # tensor names the context part takes
        self._main_inputs = main_inputs  # graph input tensor names the main part takes
        self._paths = paths
        names = {spec.name: alias for alias, spec in signature.inputs.items()}
        self.context_inputs = aliases
        self.boundary = partition.boundary
        out_alias = {spec.name: alias for alias, spec in signature.outputs.items()}
        self.context_outputs = {out_alias[t]: i for i, t in enumerate(partition.boundary) if t in out_alias
                                and t in partition.context_outputs}
        self.direct_inputs = frozenset(names[t] for t in partition.direct_inputs)
        self._output_names = {alias: spec.name for alias, spec in signature.outputs.items()}
        self._fetch_names: dict[tuple[str, ...], list[str]] = {}

    def run_context(self, lane: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        named = self._backend.feeds_by_name(feeds)
        try:
            return self._context_runs[lane](list(self.boundary), {n: named[n] for n in self._part_inputs}, None)
        except Exception as exc:
            raise engine_error(exc) from exc

    def run_main(self, lane: int, feeds: dict[str, np.ndarray], boundary: list[np.ndarray],
                 fetches: tuple[str, ...]) -> list[np.ndarray]:
        named = self._backend.feeds_by_name(feeds)
        ort_feeds = {n: v for n, v in named.items() if n in self._main_inputs}
        ort_feeds.update(zip(self.boundary, boundary))
        names = self._fetch_names.get(fetches)
        if names is None:
            names = [self._output_names[a] for a in fetches]
            if len(self._fetch_names) < _FETCH_CACHE_SIZE:  # bounded: output_filter permutations
                self._fetch_names[fetches] = names
        try:
            return self._main_runs[lane](names, ort_feeds, None)
        except Exception as exc:
            raise engine_error(exc) from exc

    def describe(self) -> dict[str, Any]:
        return {"engine": "onnxruntime: the graph partitioned at load, each part its own sessions over the "
                          "shared parameter buffers", "context_inputs": sorted(self.context_inputs),
                **self._partition.describe(), "files": [Path(p).name for p in self._paths]}

    def close(self) -> None:
        self._context_runs = []
        self._main_runs = []


def open_context_part(backend, aliases: frozenset[str]) -> tuple[OrtContextPart | None, dict[str, Any]]:
    """``backend``'s graph partitioned for the context inputs ``aliases``: (the part, a report),
    or (None, a report saying why not)."""
    import onnx

    if backend.splits_graph:
        return None, {"not_partitioned": "device placement splits the graph; broadcast requests are tiled"}
    model = onnx.load(backend.model_path, load_external_data=False)
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return None, {"not_partitioned": "the graph has control flow (If/Loop/Scan); broadcast requests are tiled"}
    inferred = onnx.shape_inference.infer_shapes(model)
    facts = _OnnxFacts(model, inferred, backend.read_parameter)
    signature = backend.signature
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    context = [signature.inputs[a].name for a in sorted(aliases)]
    nodes = [Node(f"{i}:{n.name or n.op_type}", n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}",
                  tuple(n.input), tuple(n.output),
                  {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute if a.type != onnx.AttributeProto.TENSOR})
             for i, n in enumerate(graph.node)]
    partition = find_partition(nodes, inputs, context, initializers, [o.name for o in graph.output], facts,
                               onnx_rowwise, onnx_work, ONNX_WEIGHT_SOURCES, onnx_volatile)
    if isinstance(partition, str):
        return None, {"not_partitioned": partition + "; broadcast requests are tiled"}
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    missing = [b for b in partition.boundary if b not in types or not types[b].type.tensor_type.elem_type]
    if missing:
        return None, {"not_partitioned": f"no type known for boundary tensor(s) {missing[:3]}; broadcast requests are tiled"}
    by_name = {n.name: onnx_node for n, onnx_node in zip(nodes, graph.node)}
    ctx_names, main_names = set(partition.context_nodes), set(partition.main_nodes)
    ctx_nodes = [by_name[n.name] for n in nodes if n.name in ctx_names]  # graph order: topological
    main_nodes = [by_name[n.name] for n in nodes if n.name in main_names]
    main_outputs = [o.name for o in graph.output if o.name not in partition.context_outputs]
    first = sub_model(model, inferred, types, ctx_nodes, (), list(partition.boundary), "context")
    second = sub_model(model, inferred, types, main_nodes, partition.boundary, main_outputs, "main")
    digest = hashlib.sha1("\0".join(context).encode()).hexdigest()[:12]
    directory = Path(backend.model_path).parent
    try:
        paths = (write_beside(directory, f"context_{digest}_part.onnx", first),
                 write_beside(directory, f"context_{digest}_main.onnx", second))
    except OSError as exc:
        return None, {"not_partitioned": f"the parts cannot be written beside the model: {exc}; broadcast requests are tiled"}
    reads = [frozenset(t.name for t in m.graph.initializer) for m in (first, second)]
    context_runs = backend.part_runs(paths[0], reads[0], "context")
    main_runs = backend.part_runs(paths[1], reads[1], "main")
    part_inputs = tuple(i.name for i in first.graph.input)
    main_inputs = frozenset(i.name for i in second.graph.input if i.name not in set(partition.boundary))
    return OrtContextPart(backend, signature, aliases, partition, context_runs, main_runs, part_inputs,
                          main_inputs, paths), {}
