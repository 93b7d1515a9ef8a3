"""tools/timeline/gen_timeline.py on hand-made StepStats files: Chrome JSON, summary, main().
(The script run as a process: tests/e2e/tools/test_gen_timeline_cli.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.timeline import gen_timeline
from unit.tools.timeline_helpers import BASE_US, check_chrome_trace, write_timeline


@pytest.fixture
def timeline_file(tmp_path) -> Path:
    return write_timeline(tmp_path)


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


def test_cli_errors(tmp_path, timeline_file, capsys):
    bad = tmp_path / "garbage"
    bad.write_bytes(b"\xff\xff\xff not a proto")
    assert gen_timeline.main([str(bad), str(tmp_path / "o.json")]) == 1
    assert "not a serialized StepStats" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gen_timeline.main([str(timeline_file)])  # no out.json and no --summary
    assert gen_timeline.main(["--summary", str(timeline_file), str(timeline_file)]) == 0
