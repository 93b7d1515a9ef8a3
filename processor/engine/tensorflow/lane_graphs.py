"""Per-lane copies of the serving graph: every lane on its own device, ONE set of variables.

A SavedModel graph imported once runs where its ops are placed: with lanes on several (virtual)
GPUs, only the first lane's device would ever run the dense part. So when a
:class:`~processor.engine.device_plan.DevicePlan` puts lanes on distinct devices, each distinct device
gets its own copy of the serving subgraph:

* copy 0 is the imported SavedModel graph itself (root scope), its serving ops pinned to the
  first device before import (:func:`place_first_copy`);
* copy k > 0 is the serving subgraph (the ancestors of the signature outputs and, for
  store-served embeddings, of the key tensors) imported again under ``processor_lane_<k>/``
  with ``input_map`` sending every shared-state handle (``VarHandleOp``, ``VariableV2``, hash
  tables: stateful ops that output a resource or a ref) to copy 0's handle. Those handle ops
  are left out of the copy, so the variables exist once and a delta written through them is
  seen by every copy (:func:`import_copies`).

Devices in every copy: with ``enable_device_placement_optimization`` the embedding layer (the
placement plan's CPU ops, plus the id preprocessing feeding store lookups) goes to the CPU and
the rest to the copy's device; without it every serving op goes to the copy's device. Ops that
read a shared handle directly get the handle's device (TensorFlow runs resource ops where the
resource lives), so a copy's dense reads happen on the variables' device and the values are
sent to the lane's device.

Lanes on one device (``cpu_plan``, or lanes of a GPU without ``use_multi_stream``) share one
copy: there is nothing to replicate. Without a GPU the mechanism runs on virtual CPU devices
(:func:`processor.engine.device_plan.virtual_cpu_plan`, ``ConfigProto.device_count``), which is how it
is tested. :func:`lane_map` is pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import placement

COPY_SCOPE = "processor_lane_{}"
CPU_DEVICE = "/device:CPU:0"
# Function calls take variable handles as inputs but compute on their own device.
_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


@dataclass(frozen=True)
class LaneCopy:
    """One copy of the serving graph and the lanes that run it."""

    index: int
    device: str  # where its dense part runs
    lanes: tuple[int, ...]
    scope: str = ""  # tensor name prefix ("" for copy 0; "processor_lane_<k>/" after import)


@dataclass(frozen=True)
class LaneMap:
    copies: tuple[LaneCopy, ...]
    copy_of_lane: tuple[int, ...]

    @property
    def replicated(self) -> bool:
        return len(self.copies) > 1


def lane_map(plan) -> LaneMap:
    """One copy per distinct ``tf_device`` of ``plan``'s lanes, in lane order (pure)."""
    devices = list(dict.fromkeys(d.tf_device for d in plan.lanes))
    copy_of_lane = tuple(devices.index(d.tf_device) for d in plan.lanes)
    copies = tuple(LaneCopy(i, dev, tuple(lane for lane, c in enumerate(copy_of_lane) if c == i))
                   for i, dev in enumerate(devices))
    return LaneMap(copies, copy_of_lane)


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def pin(graph_def, ops: Iterable[str], device: str, cpu_ops: set[str], cpu_device: str = CPU_DEVICE,
        handle_devices: dict[str, str] | None = None) -> int:
    """Set the device of the nodes named in ``ops`` (in place); return how many were set.

    ``cpu_ops`` go to ``cpu_device``; a direct consumer of a handle in ``handle_devices`` gets
    that handle's device (when it has one; not for function calls); the rest go to ``device``.
    """
    wanted = set(ops)
    handle_devices = handle_devices or {}
    count = 0
    for node in graph_def.node:
        if node.name not in wanted:
            continue
        homes = set() if node.op in _CALL_OPS else \
            {handle_devices[_name(r)] for r in node.input if _name(r) in handle_devices} - {""}
        if node.name in cpu_ops:
            node.device = cpu_device
        elif len(homes) == 1:
            node.device = homes.pop()
        else:
            node.device = device
        count += 1
    return count


def place_first_copy(meta_graph, outputs: list[str], lanes: LaneMap, enabled: bool,
                     pinned: bool) -> tuple[dict[str, Any], set[str]]:
    """Plan placement and, when ``pinned``, pin copy 0's serving ops in ``meta_graph`` before import.

    Returns (the report for model info, the plan's CPU ops).
    """
    graph_def = meta_graph.graph_def
    serving = placement.serving_ancestors(graph_def, outputs)
    plan = placement.plan_placement(graph_def, serving) if enabled else None
    cpu_ops = set(plan.cpu_ops) if plan is not None else set()
    report: dict[str, Any] = {"enabled": enabled, **(plan.describe() if plan is not None else {})}
    if not pinned:
        if enabled:
            report.update(applied=False, note="no GPU in this group: the plan is not applied, "
                                              "every op runs on the CPU")
        return report, cpu_ops
    first = lanes.copies[0].device
    if plan is not None:
        ops = set(plan.cpu_ops) | set(plan.gpu_ops)  # placeholders and init/saver ops stay unpinned
    else:
        ops = {n.name for n in graph_def.node if n.name in serving and n.op not in placement._SKIP_OPS}
    placed = pin(graph_def, ops, first, cpu_ops)
    if enabled:
        report.update(applied=True, cpu_device=CPU_DEVICE,
                      dense_device_per_copy=[c.device for c in lanes.copies], ops_placed=placed)
    return report, cpu_ops


def shared_state_ops(graph_def) -> list[str]:
    """Nodes whose outputs every copy must share: stateful ops that output a resource or a ref."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import op_def_registry

    shared = []
    for node in graph_def.node:
        op_def = op_def_registry.get(node.op)
        if op_def is None or not op_def.is_stateful:
            continue
        if any(arg.is_ref or arg.type == types_pb2.DT_RESOURCE for arg in op_def.output_arg):
            shared.append(node.name)
    return shared


def serving_subgraph(graph_def, dests: Iterable[str]):
    """The ancestors of ``dests`` (tensor or op names) as a GraphDef, library and versions kept."""
    keep = placement.serving_ancestors(graph_def, dests)
    sub = type(graph_def)()
    sub.versions.CopyFrom(graph_def.versions)
    sub.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in keep:
            sub.node.add().CopyFrom(node)
    return sub


def import_copies(graph, lanes: LaneMap, outputs: list[str], key_tensors: list[str], cpu_ops: set[str],
                  enabled: bool) -> LaneMap:
    """Import copies 1.. of the serving subgraph into ``graph`` (see the module doc).

    ``outputs``: the signature's output tensors; ``key_tensors``: the key tensors of store-served
    lookups (their ancestors are id preprocessing: CPU ops when ``enabled``). Returns ``lanes``
    with every copy's scope filled in.
    """
    import tensorflow as tf

    sub = serving_subgraph(graph.as_graph_def(), [*outputs, *key_tensors])
    shared = shared_state_ops(sub)
    cpu = set(cpu_ops)
    if enabled and key_tensors:
        keys = placement.serving_ancestors(sub, key_tensors)
        cpu |= {n.name for n in sub.node if n.name in keys and n.op not in placement._SKIP_OPS}
    handle_devices = {name: graph.get_operation_by_name(name).device for name in shared}
    template = type(sub)()
    template.versions.CopyFrom(sub.versions)
    template.library.CopyFrom(sub.library)
    for node in sub.node:
        if node.name in handle_devices:
            continue  # the handle ops stay in copy 0 only
        copy = template.node.add()
        copy.CopyFrom(node)
        if "_class" in copy.attr:  # colocation with ops of copy 0 is the placer's job (resource edges)
            del copy.attr["_class"]
    input_map = {}
    for name in shared:
        op = graph.get_operation_by_name(name)
        for out in op.outputs:
            input_map[out.name] = out
    anchor = _name(outputs[0])
    copies = [lanes.copies[0]]
    for lane_copy in lanes.copies[1:]:
        graph_def = type(template)()
        graph_def.CopyFrom(template)
        pin(graph_def, (n.name for n in graph_def.node if n.op not in ("Placeholder", "PlaceholderWithDefault")),
            lane_copy.device, cpu, CPU_DEVICE, handle_devices)
        with graph.as_default():
            (op,) = tf.compat.v1.import_graph_def(graph_def, input_map=input_map, return_elements=[anchor],
                                                  name=COPY_SCOPE.format(lane_copy.index))
        scope = op.name[: -len(anchor)]
        copies.append(LaneCopy(lane_copy.index, lane_copy.device, lane_copy.lanes, scope))
    return LaneMap(tuple(copies), lanes.copy_of_lane)


def describe(lanes: LaneMap, graph, enabled: bool, pinned: bool) -> dict[str, Any]:
    """Model info: the copy and devices of every lane, and each copy's op devices as set in the graph."""
    embedding = CPU_DEVICE if enabled and pinned else lanes.copies[0].device
    scopes = [c.scope for c in lanes.copies[1:]]
    op_devices: list[dict[str, int]] = [{} for _ in lanes.copies]
    for op in graph.get_operations():
        index = next((k + 1 for k, s in enumerate(scopes) if op.name.startswith(s)), 0)
        device = op.device or "unpinned (TensorFlow places it)"
        op_devices[index][device] = op_devices[index].get(device, 0) + 1
    out: dict[str, Any] = {
        "graph_copies": len(lanes.copies),
        "lanes": [{"lane": lane, "graph_copy": i, "scope": lanes.copies[i].scope,
                   "dense_device": lanes.copies[i].device, "embedding_device": embedding}
                  for lane, i in enumerate(lanes.copy_of_lane)],
        "copies": [{"copy": c.index, "scope": c.scope, "lanes": list(c.lanes), "dense_device": c.device,
                    "op_devices": dict(sorted(op_devices[c.index].items()))} for c in lanes.copies],
        "variables": ("held once, by copy 0's handle ops; the other copies use them through input_map"
                      if lanes.replicated else "held once"),
        "soft_placement": "an op with no kernel for its device runs on the CPU",
    }
    if not lanes.replicated:
        out["note"] = "every lane runs the one graph: its lanes share one device"
    return out
