"""tools/timeline/gen_timeline.py on hand-made StepStats files: Chrome JSON, summary, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from processor.tracing import step_stats
from tools.timeline import gen_timeline

REPO = Path(__file__).resolve().parents[3]
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


@pytest.fixture
def timeline_file(tmp_path) -> Path:
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


def test_chrome_trace_names_ops_devices_and_lanes(timeline_file):
    doc = gen_timeline.chrome_trace(gen_timeline.read_step_stats(timeline_file))
    check_chrome_trace(doc)
    events = doc["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {1: "/processor:stages (processor stages)",
                         2: "/job:localhost/replica:0/task:0/device:CPU:0 (engine ops)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {(1, 2): "lane 2 (default)", (2, 3): "lane 2: thread 3", (2, 4): "thread 4"}
    ops = {e["name"]: e for e in events if e["ph"] == "X"}
    assert ops["dense/MatMul"]["cat"] == "MatMul" and ops["dense/MatMul"]["dur"] == 300
    assert ops["dense/MatMul"]["ts"] == 10 and ops["request"]["ts"] == 0  # relative to the first event
    assert ops["run"]["cat"] == "processor stage"
    assert doc["otherData"]["start_unix_us"] == BASE_US


def test_summary_ranks_ops_by_total_time(timeline_file):
    stats = gen_timeline.read_step_stats(timeline_file)
    summary = gen_timeline.summarize([stats, stats], top=3)
    assert [r["name"] for r in summary["ops"]] == ["dense/MatMul", "emb/Gather", "emb/Gather_1"]
    top = summary["ops"][0]
    assert (top["count"], top["total_us"], top["op"]) == (2, 600, "MatMul")
    assert top["share"] == pytest.approx(300 / 410)
    assert [r["name"] for r in summary["stages"]] == ["request", "run"]
    text = gen_timeline.format_summary(summary)
    assert "dense/MatMul" in text and "Processor stages" in text and "dense/Relu" not in text


def test_cli_converts_and_summarizes(timeline_file, tmp_path):
    out = tmp_path / "out.json"
    script = REPO / "tools" / "timeline" / "gen_timeline.py"
    done = subprocess.run([sys.executable, str(script), "-s", str(timeline_file), str(out)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    check_chrome_trace(json.loads(out.read_text()))
    assert done.stdout.splitlines()[3].split()[1] == "dense/MatMul"  # first row of the op table
    # the tool does not need TensorFlow
    probe = ("import sys, runpy; sys.argv = ['gen_timeline', %r, %r]; "
             "sys.modules['tensorflow'] = None\n"
             "try:\n    runpy.run_path(%r, run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0\n"
             "assert 'tensorflow' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]"
             % (str(timeline_file), str(tmp_path / "b.json"), str(script)))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_cli_errors(tmp_path, timeline_file, capsys):
    bad = tmp_path / "garbage"
    bad.write_bytes(b"\xff\xff\xff not a proto")
    assert gen_timeline.main([str(bad), str(tmp_path / "o.json")]) == 1
    assert "not a serialized StepStats" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gen_timeline.main([str(timeline_file)])  # no out.json and no --summary
    assert gen_timeline.main(["--summary", str(timeline_file), str(timeline_file)]) == 0
