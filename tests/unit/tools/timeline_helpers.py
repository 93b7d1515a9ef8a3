"""Hand-made StepStats files and the Chrome trace schema, for the gen_timeline tests
(tests/unit/tools/test_gen_timeline.py and tests/e2e/tools/test_gen_timeline_cli.py)."""

from __future__ import annotations

from pathlib import Path

from processor.tracing import step_stats

BASE_US = 1_700_000_000_000_000


def check_chrome_trace(doc) -> None:
    """The Chrome trace-event schema we promise (what chrome://tracing and Perfetto need)."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]
    for e in doc["traceEvents"]:
        assert isinstance(e.get("ph"), str) and e["ph"] in {"X", "M"}, e
        assert isinstance(e.get("name"), str) and e["name"], e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            assert isinstance(e.get("cat"), str), e
        else:
            assert e["name"] in {"process_name", "thread_name", "process_sort_index"}, e
            assert "name" in e["args"] or "sort_index" in e["args"], e


def node(name: str, op: str, start: int, dur: int, tid: int = 0):
    return step_stats.NodeExecStats(node_name=name, timeline_label=f"{name} = {op}(x)",
                                    all_start_micros=BASE_US + start, op_start_rel_micros=0,
                                    op_end_rel_micros=dur, all_end_rel_micros=dur, thread_id=tid)


def write_timeline(tmp_path: Path) -> Path:
    """A StepStats file: CPU ops on two threads of lane 2 and the processor's stages."""
    cpu = step_stats.DeviceStepStats(device="/job:localhost/replica:0/task:0/device:CPU:0")
    cpu.node_stats.extend([node("dense/MatMul", "MatMul", 10, 300, 3), node("dense/Relu", "Relu", 320, 20, 3),
                           node("emb/Gather", "ResourceGather", 5, 50, 4), node("emb/Gather_1", "ResourceGather", 60, 40, 4)])
    cpu.thread_names[3] = "lane 2: thread 3"
    stages = step_stats.DeviceStepStats(device="/processor:stages")
    stages.node_stats.extend([node("request", "request", 0, 400, 2), node("run", "run", 2, 390, 2)])
    stages.thread_names[2] = "lane 2 (default)"
    path = tmp_path / "timeline-0"
    path.write_bytes(step_stats.StepStats(dev_stats=[cpu, stages]).SerializeToString())
    return path
