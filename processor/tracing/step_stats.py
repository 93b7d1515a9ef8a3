"""TensorFlow's ``StepStats`` proto without TensorFlow: the timeline file format.

A timeline file is one serialized ``tensorflow.StepStats`` (DeepRec writes
``run_metadata.step_stats().SerializeToString()``), so DeepRec's ``gen_timeline.py`` and
TensorFlow's ``tensorflow.python.client.timeline`` read our files. This module declares the
subset of ``tensorflow/core/framework/step_stats.proto`` that the timeline tools use, with the
same field numbers, through the protobuf runtime only (no protoc, no TensorFlow). Fields it does
not declare (memory, outputs, tensor descriptions) survive a parse and re-serialize as unknown
fields, so a StepStats from TensorFlow passes through unchanged.

The messages live in a private descriptor pool, so they never clash with TensorFlow's own
``tensorflow.StepStats`` when both are loaded in one process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .events import TraceEvent

_F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: int, repeated: bool = False, type_name: str = ""):
    f = _F(name=name, number=number, type=kind,
           label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        f.type_name = type_name
    return f


def _build_pool() -> descriptor_pool.DescriptorPool:
    file = descriptor_pb2.FileDescriptorProto(
        name="processor/tracing/step_stats_subset.proto", package="tensorflow", syntax="proto3")
    node = file.message_type.add(name="NodeExecStats")
    node.field.extend([
        _field("node_name", 1, _F.TYPE_STRING),
        _field("all_start_micros", 2, _F.TYPE_INT64),
        _field("op_start_rel_micros", 3, _F.TYPE_INT64),
        _field("op_end_rel_micros", 4, _F.TYPE_INT64),
        _field("all_end_rel_micros", 5, _F.TYPE_INT64),
        _field("timeline_label", 8, _F.TYPE_STRING),
        _field("scheduled_micros", 9, _F.TYPE_INT64),
        _field("thread_id", 10, _F.TYPE_UINT32),
        _field("all_start_nanos", 13, _F.TYPE_INT64),
        _field("op_start_rel_nanos", 14, _F.TYPE_INT64),
        _field("op_end_rel_nanos", 15, _F.TYPE_INT64),
        _field("all_end_rel_nanos", 16, _F.TYPE_INT64),
        _field("scheduled_nanos", 17, _F.TYPE_INT64),
    ])
    device = file.message_type.add(name="DeviceStepStats")
    entry = device.nested_type.add(name="ThreadNamesEntry")
    entry.field.extend([_field("key", 1, _F.TYPE_UINT32), _field("value", 2, _F.TYPE_STRING)])
    entry.options.map_entry = True
    device.field.extend([
        _field("device", 1, _F.TYPE_STRING),
        _field("node_stats", 2, _F.TYPE_MESSAGE, True, ".tensorflow.NodeExecStats"),
        _field("thread_names", 3, _F.TYPE_MESSAGE, True, ".tensorflow.DeviceStepStats.ThreadNamesEntry"),
    ])
    steps = file.message_type.add(name="StepStats")
    steps.field.append(_field("dev_stats", 1, _F.TYPE_MESSAGE, True, ".tensorflow.DeviceStepStats"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool


_POOL = _build_pool()
StepStats = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.StepStats"))
DeviceStepStats = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.DeviceStepStats"))
NodeExecStats = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.NodeExecStats"))


def parse(data: bytes):
    """A serialized StepStats -> a StepStats message (raises google.protobuf DecodeError)."""
    stats = StepStats()
    stats.ParseFromString(data)
    return stats


def op_type(node) -> str:
    """The op type of a NodeExecStats: from TensorFlow's ``name = Op(inputs)`` timeline label."""
    label = node.timeline_label
    head, sep, rest = label.partition(" = ")
    if sep:
        op = rest.split("(", 1)[0].strip()
        if op:
            return op
    return node.node_name or "unknown"


def node_times_us(node) -> tuple[float, float]:
    """(start, duration) of the op itself in microseconds since the Unix epoch.

    Uses the nanosecond fields when the writer filled them (TensorFlow does), else the micros.
    """
    if node.all_start_nanos:
        start = (node.all_start_nanos + node.op_start_rel_nanos) / 1000.0
        end = (node.all_start_nanos + node.op_end_rel_nanos) / 1000.0
    else:
        start = float(node.all_start_micros + node.op_start_rel_micros)
        end = float(node.all_start_micros + node.op_end_rel_micros)
    return start, max(0.0, end - start)


def iter_events(stats) -> Iterator[TraceEvent]:
    """Every node of a StepStats as an engine-agnostic :class:`TraceEvent`."""
    for dev in stats.dev_stats:
        for node in dev.node_stats:
            start, duration = node_times_us(node)
            yield TraceEvent(name=node.node_name, op=op_type(node), device=dev.device,
                             thread=node.thread_id, start_us=start, duration_us=duration)


def node_from_event(event: TraceEvent, label_args: str = ""):
    """A NodeExecStats for one event, with a TensorFlow-style ``name = Op(args)`` label."""
    start_ns = int(round(event.start_us * 1000))
    dur_ns = max(0, int(round(event.duration_us * 1000)))
    start_us = start_ns // 1000
    end_rel_us = (start_ns + dur_ns) // 1000 - start_us
    return NodeExecStats(
        node_name=event.name, timeline_label=f"{event.name} = {event.op}({label_args})",
        thread_id=event.thread & 0xFFFFFFFF,
        all_start_micros=start_us, op_start_rel_micros=0, op_end_rel_micros=end_rel_us,
        all_end_rel_micros=end_rel_us, scheduled_micros=start_us,
        all_start_nanos=start_ns, op_start_rel_nanos=0, op_end_rel_nanos=dur_ns,
        all_end_rel_nanos=dur_ns, scheduled_nanos=start_ns)


def devices_from_events(events: Iterable[TraceEvent], thread_names: dict[int, str] | None = None) -> list:
    """Group events into one DeviceStepStats per ``event.device``, in order of first appearance."""
    out: dict[str, object] = {}
    for event in events:
        dev = out.get(event.device)
        if dev is None:
            dev = out[event.device] = DeviceStepStats(device=event.device)
        dev.node_stats.append(node_from_event(event))
    for dev in out.values():
        for tid, name in (thread_names or {}).items():
            dev.thread_names[tid & 0xFFFFFFFF] = name
    return list(out.values())
