"""Timeline file -> Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev), or an op summary.

A timeline file is a serialized TensorFlow ``StepStats``, as DeepRec's processor and this one
write them (``<timeline_path>/timeline-<k>``). Usage, DeepRec's plus a summary mode::

    python tools/timeline/gen_timeline.py timeline-0 out.json
    python tools/timeline/gen_timeline.py --summary [--top 15] timeline-0 [timeline-1 ...]
    python tools/timeline/gen_timeline.py -s timeline-0 out.json     # both

In the JSON each device is a process (the processor's own stages as ``/processor:stages``,
then the engine's devices: TensorFlow's ``/job:localhost/...``, ONNX Runtime's providers as
``/ort:CPUExecutionProvider``), each thread a track named after its lane (``lane 0: thread 12``),
each op a complete event named after its graph node, with its op type as category. Times are
microseconds from the earliest event; the absolute start is kept in ``otherData``.

Needs only the protobuf runtime (no TensorFlow): the file is parsed with
:mod:`processor.tracing.step_stats`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

try:
    from processor.tracing import step_stats
except ImportError:  # run as a script from a checkout: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from processor.tracing import step_stats

PROCESSOR_DEVICE_PREFIX = "/processor:"


def read_step_stats(path: str | Path):
    """Parse a timeline file; ValueError naming the file when it is not a StepStats."""
    data = Path(path).read_bytes()
    try:
        stats = step_stats.parse(data)
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise ValueError(f"{path}: not a serialized StepStats timeline file ({exc})") from None
    if data and not stats.dev_stats:
        raise ValueError(f"{path}: not a serialized StepStats timeline file (no devices)")
    return stats


def _is_processor(device: str) -> bool:
    return device.startswith(PROCESSOR_DEVICE_PREFIX)


def _device_title(device: str) -> str:
    return f"{device} (processor stages)" if _is_processor(device) else f"{device} (engine ops)"


def chrome_trace(stats, source: str = "") -> dict:
    """A StepStats as a Chrome trace dict: ``{"traceEvents": [...], ...}``."""
    nodes = [(dev, node) for dev in stats.dev_stats for node in dev.node_stats]
    base = min((step_stats.node_times_us(n)[0] for _, n in nodes), default=0.0)
    events: list[dict] = []
    # Processor stages first, then engine devices in file order.
    devices = sorted(stats.dev_stats, key=lambda d: 0 if _is_processor(d.device) else 1)
    for pid, dev in enumerate(devices, start=1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"name": _device_title(dev.device)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"sort_index": pid}})
        threads = sorted({n.thread_id for n in dev.node_stats} | set(dev.thread_names))
        for tid in threads:
            name = dev.thread_names.get(tid) or f"thread {tid}"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                           "args": {"name": name}})
        for node in dev.node_stats:
            start, duration = step_stats.node_times_us(node)
            op = step_stats.op_type(node)
            events.append({
                "ph": "X", "cat": "processor stage" if _is_processor(dev.device) else op, "name": node.node_name or op, "pid": pid, "tid": node.thread_id,
                "ts": round(start - base, 3), "dur": round(duration, 3),
                "args": {"name": node.node_name, "op": op, "device": dev.device,
                         "label": node.timeline_label},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": source, "format": "TensorFlow StepStats",
                          "start_unix_us": round(base, 3)}}


def summarize(stats_list: Iterable, top: int = 15) -> dict:
    """Engine ops by total time (over all files given), and the processor's stages.

    ``ops``: list of dicts (name, op, device, count, total_us, mean_us, max_us, share) sorted by
    total time, heaviest first; ``stages``: the same per processor stage name.
    """
    ops: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    stages: dict[str, list[float]] = defaultdict(list)
    files = 0
    for stats in stats_list:
        files += 1
        for dev in stats.dev_stats:
            for node in dev.node_stats:
                _, duration = step_stats.node_times_us(node)
                if _is_processor(dev.device):
                    stages[node.node_name].append(duration)
                else:
                    ops[(node.node_name, step_stats.op_type(node), dev.device)].append(duration)
    engine_total = sum(sum(v) for v in ops.values()) or 1.0

    def row(values: list[float]) -> dict:
        return {"count": len(values), "total_us": sum(values), "mean_us": sum(values) / len(values),
                "max_us": max(values)}

    op_rows = [{"name": k[0], "op": k[1], "device": k[2], **row(v),
                "share": sum(v) / engine_total} for k, v in ops.items()]
    op_rows.sort(key=lambda r: (-r["total_us"], r["name"]))
    stage_rows = [{"name": k, **row(v)} for k, v in stages.items()]
    stage_rows.sort(key=lambda r: -r["total_us"])
    return {"files": files, "ops": op_rows[:top], "op_count": len(op_rows),
            "engine_total_us": engine_total if ops else 0.0, "stages": stage_rows}


def format_summary(summary: dict) -> str:
    """The summary as plain-text tables."""
    lines = [f"Top {len(summary['ops'])} of {summary['op_count']} ops by total time "
             f"({summary['files']} trace file(s), engine op time {summary['engine_total_us']:.0f} us)"]
    header = f"{'#':>3}  {'op name':<44} {'op type':<24} {'calls':>5} {'total us':>10} {'mean us':>9} {'max us':>9} {'share':>6}"
    lines += [header, "-" * len(header)]
    for i, r in enumerate(summary["ops"], start=1):
        lines.append(f"{i:>3}  {_clip(r['name'], 44):<44} {_clip(r['op'], 24):<24} {r['count']:>5} "
                     f"{r['total_us']:>10.1f} {r['mean_us']:>9.1f} {r['max_us']:>9.1f} {r['share']:>6.1%}")
    if summary["stages"]:
        lines += ["", "Processor stages (nested: request > parse, acquire, decode, run > lane_wait, engine, return; "
                      "encode; the tracing's own cost on ONNX Runtime: lane_wait > trace_setup, return > trace_collect)"]
        header = f"{'stage':<14} {'calls':>5} {'total us':>10} {'mean us':>9} {'max us':>9}"
        lines += [header, "-" * len(header)]
        for r in summary["stages"]:
            lines.append(f"{r['name']:<14} {r['count']:>5} {r['total_us']:>10.1f} {r['mean_us']:>9.1f} {r['max_us']:>9.1f}")
    return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gen_timeline.py", description=__doc__.split("\n\n")[0],
        epilog="Open the JSON in chrome://tracing or https://ui.perfetto.dev.")
    parser.add_argument("timeline_file", nargs="+",
                        help="timeline file(s); without --summary: exactly one file, then out.json")
    parser.add_argument("-s", "--summary", action="store_true",
                        help="print the heaviest ops (and the processor's stages) as a table")
    parser.add_argument("--top", type=int, default=15, help="ops in the summary (default 15)")
    args = parser.parse_args(argv)

    files = list(args.timeline_file)
    out_json = None
    if not args.summary:
        if len(files) != 2:
            parser.error("usage: gen_timeline.py timeline_file out.json (or --summary timeline_file ...)")
        out_json = files.pop()
    elif len(files) > 1 and files[-1].endswith(".json"):
        out_json = files.pop()
        if len(files) != 1:
            parser.error("converting to JSON takes exactly one timeline file")
    try:
        stats_list = [read_step_stats(f) for f in files]
    except (OSError, ValueError) as exc:
        print(f"gen_timeline: {exc}", file=sys.stderr)
        return 1
    if out_json is not None:
        trace = chrome_trace(stats_list[0], source=files[0])
        Path(out_json).write_text(json.dumps(trace))
        print(f"wrote {out_json}: {sum(e['ph'] == 'X' for e in trace['traceEvents'])} events "
              f"on {len(stats_list[0].dev_stats)} device(s)", file=sys.stderr)
    if args.summary:
        print(format_summary(summarize(stats_list, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
