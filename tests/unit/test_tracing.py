"""Timeline tracing without an engine: step counting, the StepStats format, sinks, the writer."""

from __future__ import annotations

import threading
import time

import fsspec
import pytest

from processor.errors import ConfigError
from processor.tracing import PROCESSOR_DEVICE, EngineTrace, TraceEvent, Tracer, step_stats
from processor.tracing.tracer import build_step_stats


def traced_steps(tracer: Tracer, requests: int) -> list[int]:
    out = []
    for _ in range(requests):
        rec = tracer.begin()
        if rec is not None:
            out.append(rec.step)
    return out


@pytest.mark.parametrize("start, interval, count, want", [
    (0, 1, 1, [0]),
    (0, 1, 3, [0, 1, 2]),
    (2, 3, 4, [2, 5, 8, 11]),
    (5, 1, 2, [5, 6]),
    (1, 10, 2, [1, 11]),
])
def test_deeprec_step_counting(tmp_path, start, interval, count, want):
    tracer = Tracer("m", start, interval, count, str(tmp_path))
    assert traced_steps(tracer, 40) == want
    assert tracer.done


def test_done_as_soon_as_the_last_trace_is_handed_out(tmp_path):
    tracer = Tracer("m", 2, 3, 2, str(tmp_path))  # traces steps 2 and 5
    assert traced_steps(tracer, 5) == [2]
    assert not tracer.done
    rec = tracer.begin()
    assert rec is not None and rec.step == 5 and rec.ordinal == 1
    assert tracer.done
    assert tracer.begin() is None
    assert tracer.describe()["steps_counted"] == 6  # counting stops with the last trace


def test_counting_is_thread_safe(tmp_path):
    tracer = Tracer("m", 5, 7, 100, str(tmp_path))
    got: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(1000):
            rec = tracer.begin()
            if rec is not None:
                got[i].append(rec.step)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = sorted(s for own in got for s in own)
    assert steps == [5 + 7 * i for i in range(100)]
    assert tracer.stats["traced"] == 100


def test_bad_paths_fail_with_a_config_error_naming_timeline_path(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    with pytest.raises(ConfigError, match="timeline_path"):
        Tracer("m", 0, 1, 1, str(blocker / "sub"))
    with pytest.raises(ConfigError, match="timeline_path"):
        Tracer("m", 0, 1, 1, "nosuchprotocol://bucket/dir")


def test_path_is_created(tmp_path):
    target = tmp_path / "a" / "b"
    Tracer("m", 0, 1, 1, str(target))
    assert target.is_dir()
    assert list(target.iterdir()) == []  # the probe file is gone


def _recorder(tracer: Tracer, lane: int = 1):
    rec = tracer.begin()
    assert rec is not None
    base = time.time_ns() / 1000
    rec.lane = lane
    rec.stages = [("request", base, 100.0), ("decode", base + 1, 5.0), ("run", base + 10, 70.0)]
    rec.run_window = (base + 10, base + 80)
    rec.engine = EngineTrace(events=[
        TraceEvent("dense/MatMul", "MatMul", "ort:CPUExecutionProvider", 7, base + 20, 30.0),
        TraceEvent("dense/Relu", "Relu", "ort:CPUExecutionProvider", 7, base + 55, 5.0),
    ], thread_names={7: "intra-op 0"})
    return rec


def test_events_only_engine_becomes_step_stats(tmp_path):
    tracer = Tracer("m", 0, 1, 1, str(tmp_path))
    stats = step_stats.parse(build_step_stats(_recorder(tracer), "m"))
    devices = {d.device: d for d in stats.dev_stats}
    assert set(devices) == {"ort:CPUExecutionProvider", PROCESSOR_DEVICE}
    engine = devices["ort:CPUExecutionProvider"]
    assert [n.node_name for n in engine.node_stats] == ["dense/MatMul", "dense/Relu"]
    assert [step_stats.op_type(n) for n in engine.node_stats] == ["MatMul", "Relu"]
    assert engine.thread_names[7] == "lane 1: intra-op 0"
    start, dur = step_stats.node_times_us(engine.node_stats[0])
    assert dur == pytest.approx(30.0, abs=0.5)
    stages = devices[PROCESSOR_DEVICE]
    names = [n.node_name for n in stages.node_stats]
    # derived from the engine's first and last op inside the run window
    assert set(names) == {"request", "decode", "run", "lane_wait", "engine", "return"}
    by_name = {n.node_name: step_stats.node_times_us(n) for n in stages.node_stats}
    assert by_name["lane_wait"][1] == pytest.approx(10.0, abs=0.5)
    assert by_name["engine"][1] == pytest.approx(40.0, abs=0.5)
    assert by_name["return"][1] == pytest.approx(20.0, abs=0.5)
    assert {n.thread_id for n in stages.node_stats} == {1}
    assert stages.thread_names[1] == "lane 1 (m)"
    assert "step=0" in stages.node_stats[0].timeline_label


def test_native_step_stats_pass_through_with_unknown_fields(tmp_path):
    # A StepStats carrying a field this subset does not declare (NodeExecStats.memory = 6).
    node = step_stats.NodeExecStats(node_name="a", timeline_label="a = Add(x, y)", all_start_micros=10,
                                    op_end_rel_micros=5, all_end_rel_micros=5)
    unknown = bytes([0x32, 0x03, 0x0A, 0x01, 0x78])  # field 6, length 3: {allocator_name: "x"}
    dev = step_stats.DeviceStepStats(device="/device:CPU:0")
    dev.node_stats.add().ParseFromString(node.SerializeToString() + unknown)
    native = step_stats.StepStats(dev_stats=[dev]).SerializeToString()
    tracer = Tracer("m", 0, 1, 1, str(tmp_path))
    rec = tracer.begin()
    rec.engine = EngineTrace(step_stats=native)
    data = build_step_stats(rec, "m")
    assert unknown in data
    stats = step_stats.parse(data)
    assert [d.device for d in stats.dev_stats] == ["/device:CPU:0", PROCESSOR_DEVICE]
    assert stats.dev_stats[0].thread_names[0] == "no lane (failed before run): thread 0"


def test_writer_writes_numbered_files(tmp_path):
    tracer = Tracer("m", 0, 1, 3, str(tmp_path))
    for _ in range(3):
        tracer.submit(_recorder(tracer))
    assert tracer.flush(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline-0", "timeline-1", "timeline-2"]
    for p in tmp_path.iterdir():
        assert step_stats.parse(p.read_bytes()).dev_stats
    assert tracer.stats["written"] == 3 and tracer.stats["write_errors"] == 0
    tracer.close()


def test_two_tracers_on_one_path_never_overwrite(tmp_path):
    a, b = Tracer("a", 0, 1, 2, str(tmp_path)), Tracer("b", 0, 1, 2, str(tmp_path))
    for tracer in (a, b, a, b):
        tracer.submit(_recorder(tracer))
        tracer.flush(10)
    assert len(list(tmp_path.iterdir())) == 4


def test_write_errors_are_counted_never_raised(tmp_path):
    target = tmp_path / "tl"
    tracer = Tracer("m", 0, 1, 2, str(target))
    target.rmdir()
    target.write_bytes(b"now a file")  # every write fails from here on
    for _ in range(2):
        tracer.submit(_recorder(tracer))  # does not raise
    assert tracer.flush(10)
    assert tracer.stats["write_errors"] == 2 and tracer.stats["written"] == 0
    assert "Error" in tracer.stats["last_error"]
    tracer.close()


def test_a_slow_store_drops_traces_instead_of_blocking(tmp_path, monkeypatch):
    from processor.tracing.tracer import _QUEUE_SIZE

    tracer = Tracer("m", 0, 1, 100, str(tmp_path))
    release = threading.Event()
    writing = threading.Event()

    def stuck_write(name, data):
        writing.set()
        release.wait(60)

    monkeypatch.setattr(tracer._sink, "write", stuck_write)
    tracer.submit(_recorder(tracer))
    assert writing.wait(30)  # the writer is stuck in the store with the first trace

    def submit_more():
        for _ in range(79):
            tracer.submit(_recorder(tracer))

    submitter = threading.Thread(target=submit_more)
    submitter.start()
    # Hang detector, not a timing assert: 79 submits take milliseconds; one that waited for
    # the stuck write would still be waiting here (the write waits for `release`).
    submitter.join(30)
    blocked = submitter.is_alive()
    release.set()
    submitter.join()
    assert not blocked, "submit blocked on the stuck store"
    assert tracer.stats["dropped"] == 79 - _QUEUE_SIZE  # the queue filled; the rest were dropped
    assert tracer.flush(10)
    assert tracer.stats["written"] == 1 + _QUEUE_SIZE
    tracer.close()


def test_remote_url_through_fsspec():
    url = "memory://timeline-unit/traces"
    tracer = Tracer("m", 0, 1, 2, url)
    for _ in range(2):
        tracer.submit(_recorder(tracer))
    assert tracer.flush(10)
    fs = fsspec.filesystem("memory")
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls("/timeline-unit/traces", detail=False))
    assert names == ["timeline-0", "timeline-1"]
    assert step_stats.parse(fs.cat("/timeline-unit/traces/timeline-1")).dev_stats
    fs.rm("/timeline-unit", recursive=True)
    tracer.close()


def test_closed_tracer_drops(tmp_path):
    tracer = Tracer("m", 0, 1, 2, str(tmp_path))
    rec = tracer.begin()
    tracer.close()
    tracer.submit(rec)
    assert tracer.stats["dropped"] == 1
    assert list(tmp_path.iterdir()) == []


def test_session_group_runs_untraced_when_the_engine_cannot_trace():
    from processor.engine.session_group import SessionGroup
    from processor.engine.update_gate import UpdateGate
    from processor.signature import Signature

    class Engine:
        lanes = 2
        signature = Signature("serving_default", {}, {})
        fingerprinted_inputs = frozenset()

        def wire_server(self, codec):
            return None

        def update_gate(self):
            return UpdateGate()

        def run(self, lane, feeds, fetches):
            return [f"lane {lane}"]

        def run_traced(self, lane, feeds, fetches):
            raise NotImplementedError("no per-call profiling")

    group = SessionGroup(Engine(), "RR", None, 0.0)
    lane, outputs, trace = group.run_traced({}, ("y",))
    assert outputs == [f"lane {lane}"] and trace is None
    del Engine.run_traced  # a backend without the method at all
    assert group.run_traced({}, ("y",))[2] is None


# --- ONNX Runtime profiles (processor.engine.onnx.profile) -------------------------------------

def _ort_records() -> list[dict]:
    """An ORT 1.31 profile of two runs (a warm-up, then the profiled run), trimmed."""
    def node(name, op, ts, dur, tid=41, provider="CPUExecutionProvider"):
        return {"cat": "Node", "pid": 40, "tid": tid, "dur": dur, "ts": ts, "ph": "X", "name": name,
                "args": {"op_name": op, "provider": provider, "thread_scheduling_stats": ""}}

    return [
        {"cat": "Session", "pid": 40, "tid": 40, "dur": 300, "ts": 10, "ph": "X", "name": "model_loading_uri"},
        {"cat": "Session", "pid": 40, "tid": 40, "dur": 5000, "ts": 400, "ph": "X", "name": "session_initialization"},
        node("emb/Gather_kernel_time", "Gather", 6000, 90),  # warm-up run
        {"cat": "Session", "pid": 40, "tid": 41, "dur": 200, "ts": 5990, "ph": "X", "name": "model_run"},
        node("emb/Gather_fence_before", "Gather", 7005, 0),
        node("emb/Gather_kernel_time", "Gather", 7010, 40),
        node("fused mlp/MatMulAddFusion_kernel_time", "FusedGemm", 7060, 25, tid=42),
        node("probability_kernel_time", "Sigmoid", 7090, 3),
        {"cat": "Session", "pid": 40, "tid": 41, "dur": 100, "ts": 7000, "ph": "X", "name": "model_run"},
    ]


def test_ort_profile_events_keep_the_last_run_on_the_wall_clock():
    from processor.engine.onnx import profile as ort_profile

    origin = ort_profile.origin_us(_ort_records(), 1_700_000_000_000_000_000, 0)
    events = ort_profile.events(_ort_records(), origin)
    assert [(e.name, e.op) for e in events] == [
        ("emb/Gather", "Gather"), ("fused mlp/MatMulAddFusion", "FusedGemm"), ("probability", "Sigmoid")]
    assert {e.device for e in events} == {"/ort:CPUExecutionProvider"}
    assert events[0].start_us == 1_700_000_000_000_000 + 7010 and events[0].duration_us == 40
    assert [e.thread for e in events] == [41, 42, 41]
    assert ort_profile.thread_names(events, caller=41) == {41: "calling thread", 42: "ORT pool thread 42"}
    # no wall-clock profiler start: the last model_run starts when the run was called
    assert ort_profile.origin_us(_ort_records(), None, 9_000_000) == 9_000 - 7000
    cuda = [dict(r, args=dict(r["args"], provider="CUDAExecutionProvider")) if r["cat"] == "Node" else r
            for r in _ort_records()]
    assert {e.device for e in ort_profile.events(cuda, 0.0, gpu=1)} == {"/ort:CUDAExecutionProvider/gpu:1"}
    assert ort_profile.device_name("CPUExecutionProvider", gpu=1) == "/ort:CPUExecutionProvider"
    with pytest.raises(ValueError, match="model_run"):
        ort_profile.events([r for r in _ort_records() if r["name"] != "model_run"], 0.0)


def test_ort_profile_collect_deletes_the_file_and_never_raises(tmp_path):
    import json

    from processor.engine.onnx import profile as ort_profile

    class Session:
        def __init__(self, result):
            self.result = result

        def end_profiling(self):
            if isinstance(self.result, Exception):
                raise self.result
            return self.result

    path = tmp_path / "lane0_2026.json"
    path.write_text(json.dumps(_ort_records()))
    assert ort_profile.collect(Session(str(path))) == _ort_records()
    assert not path.exists()
    path.write_text("{not json")
    assert ort_profile.collect(Session(str(path))) == [] and not path.exists()
    assert ort_profile.collect(Session("")) == []  # profiling already ended
    assert ort_profile.collect(Session(RuntimeError("boom"))) == []


def test_engine_stages_join_the_processor_stages(tmp_path):
    tracer = Tracer("m", 0, 1, 1, str(tmp_path))
    rec = _recorder(tracer)
    base = rec.run_window[0]
    rec.engine = EngineTrace(events=rec.engine.events, stages=(("trace_setup", base + 1, 8.0),))
    stats = step_stats.parse(build_step_stats(rec, "m"))
    stages = next(d for d in stats.dev_stats if d.device == PROCESSOR_DEVICE)
    by_name = {n.node_name: step_stats.node_times_us(n) for n in stages.node_stats}
    assert by_name["trace_setup"][1] == pytest.approx(8.0, abs=0.5)
    assert by_name["lane_wait"][1] == pytest.approx(10.0, abs=0.5)  # still run start to first op
