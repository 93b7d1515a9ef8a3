"""Timeline tracing end to end: the demo CTR model served with the timeline_* keys.

Checks the trace files (start / interval / count exactly), their content (graph op names,
processor stages, lanes), gen_timeline's JSON and summary, DeepRec compatibility (TensorFlow's
own timeline tool reads the files), and that tracing never fails or changes a request; on
TensorFlow and on ONNX Runtime (per-op profiles of the converted graph).
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import threading
from contextlib import redirect_stdout

import fsspec
import pytest

from conftest import model_config
from sp_checks import assert_outputs_close
from processor import abi, codec
from processor.errors import ProcessorError
from processor.request import PredictCall
from processor.tracing import PROCESSOR_DEVICE, step_stats
from tools.timeline import gen_timeline

STAGES = {"request", "parse", "acquire", "decode", "run", "lane_wait", "engine", "return", "encode"}
ORT_DEVICE = "/ort:CPUExecutionProvider"


def untraced(p, data: bytes) -> bytes:
    """The reference answer to ``data``, computed off the traced path."""
    with p.manager.acquire() as group:
        decoded = codec.decode_message(codec.parse_request(data), group.signature)
        arrays = group.run(decoded.feeds, tuple(alias for _, alias in decoded.fetches))
        return codec.encode_response({key: a for (key, _), a in zip(decoded.fetches, arrays)})


def check_chrome_trace(doc) -> None:
    """Hand-written schema check: ``traceEvents`` with ph, ts, dur, pid, tid and names."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]
    for e in doc["traceEvents"]:
        assert e.get("ph") in {"X", "M"}, e
        assert isinstance(e.get("name"), str) and e["name"], e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
        else:
            assert isinstance(e.get("args"), dict) and e["args"], e


def timeline_config(paths, path, start, interval, count, **extra) -> dict:
    return model_config(paths, timeline_start_step=start, timeline_interval_step=interval,
                        timeline_trace_count=count, timeline_path=str(path), **extra)


def assert_summary_ranks_heaviest_first(files: list[str]) -> None:
    """gen_timeline --summary: the heaviest engine op (total over the files) heads the table."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert gen_timeline.main(["--summary", "--top", "5", *files]) == 0
    totals: dict[str, float] = {}
    for f in files:
        for dev in gen_timeline.read_step_stats(f).dev_stats:
            if dev.device != PROCESSOR_DEVICE:
                for n in dev.node_stats:
                    totals[n.node_name] = totals.get(n.node_name, 0.0) + step_stats.node_times_us(n)[1]
    heaviest = max(totals, key=totals.get)
    rows = buf.getvalue().splitlines()
    assert rows[0].startswith("Top 5 of")
    assert rows[3][5:49].rstrip() == (heaviest if len(heaviest) <= 44 else heaviest[:43] + "~")
    assert "Processor stages" in buf.getvalue()


def graph_node_names(savedmodel_dir) -> set[str]:
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((savedmodel_dir / "saved_model.pb").read_bytes())
    return {n.name for n in sm.meta_graphs[0].graph_def.node}


def test_traces_follow_start_interval_count(ctr_model_small, make_processor, tmp_path):
    from demo.synthetic_data import synthetic_batch

    out = tmp_path / "timelines"
    p = make_processor(timeline_config(ctr_model_small, out, start=2, interval=3, count=3,
                                       session_num=2, use_per_session_threads=True))
    assert "timeline_path" not in p.model_info()["accepted_not_active"]
    feeds = [synthetic_batch(8, seed) for seed in range(15)]
    requests = [codec.encode_request(f) for f in feeds]
    bodies = {}
    for i, request in enumerate(requests):
        if i == 8:  # a traced step through the numpy entry point (HTTP/JSON front-ends)
            got = p.dataplane.predict(PredictCall(p.name, feeds[i])).outputs
            assert set(got) == {"probability", "logits"}
            continue
        status, bodies[i] = p.process(request)
        assert status == 200, bodies[i]
    assert p.tracer.flush(30)
    assert sorted(f.name for f in out.iterdir()) == ["timeline-0", "timeline-1", "timeline-2"]
    info = p.model_info()["timeline"]
    assert (info["traced"], info["written"], info["write_errors"], info["done"]) == (3, 3, 0, True)
    assert info["steps_counted"] == 9  # steps 0..8; nothing is counted after the last trace

    # traced requests (steps 2 and 5) gave the same bytes as untraced ones (tracing is done now)
    assert all(p.process(requests[i])[1] == bodies[i] for i in (1, 2, 5))

    graph_nodes = graph_node_names(ctr_model_small.savedmodel_dir)
    for k, step in enumerate((2, 5, 8)):
        stats = gen_timeline.read_step_stats(out / f"timeline-{k}")
        stage_dev = [d for d in stats.dev_stats if d.device == PROCESSOR_DEVICE]
        assert len(stage_dev) == 1
        names = {n.node_name for n in stage_dev[0].node_stats}
        assert names == (STAGES - {"encode"} if step == 8 else STAGES)  # arrays in: no encode
        request_label = next(n.timeline_label for n in stage_dev[0].node_stats if n.node_name == "request")
        assert f"step={step}" in request_label and f"trace={k}" in request_label

        doc = gen_timeline.chrome_trace(stats, source=str(out / f"timeline-{k}"))
        check_chrome_trace(json.loads(json.dumps(doc)))
        ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "processor stage"]
        op_names = {e["name"] for e in ops}
        assert len(op_names & graph_nodes) >= 20, sorted(op_names)
        assert {"ResourceGather", "StringToHashBucketFast"} <= {e["cat"] for e in ops}
        threads = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
        assert any(t.startswith("lane ") for t in threads), threads
        # the engine ran inside the run stage
        stages = {e["name"]: e for e in doc["traceEvents"] if e.get("cat") == "processor stage"}
        run = stages["run"]
        assert all(run["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= run["ts"] + run["dur"] + 1 for e in ops)

    assert_summary_ranks_heaviest_first([str(out / f"timeline-{k}") for k in range(3)])

    # DeepRec compatibility: TensorFlow's timeline tool (what DeepRec's gen_timeline.py runs)
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.client import timeline

    metadata = config_pb2.RunMetadata()
    metadata.step_stats.ParseFromString((out / "timeline-0").read_bytes())
    tf_doc = json.loads(timeline.Timeline(metadata.step_stats).generate_chrome_trace_format())
    tf_names = {e["args"].get("name") for e in tf_doc["traceEvents"] if e.get("ph") == "X"}
    assert {"decode", "run", "encode"} <= tf_names and len(tf_names & graph_nodes) >= 20


def test_onnxruntime_traces_show_the_onnx_ops(ctr_model_small, make_processor, tmp_path, monkeypatch):
    import onnx

    from demo.synthetic_data import synthetic_batch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where ORT's profile files go
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "timelines"
    p = make_processor(timeline_config(ctr_model_small, out, start=1, interval=2, count=3, backend="onnxruntime",
                                       session_num=2, use_per_session_threads=True, select_session_policy="RR"))
    requests = [codec.encode_request(synthetic_batch(16, seed)) for seed in range(8)]
    expected = [untraced(p, r) for r in requests]  # untraced
    assert [p.process(r) for r in requests] == [(200, body) for body in expected]  # steps 1, 3, 5 traced
    assert p.tracer.flush(30)
    assert sorted(f.name for f in out.iterdir()) == ["timeline-0", "timeline-1", "timeline-2"]
    info = p.model_info()
    assert (info["timeline"]["written"], info["timeline"]["write_errors"]) == (3, 0)

    model = onnx.load(f"{info['session_group']['model']['cache']}/model.onnx")
    onnx_nodes = {n.name for n in model.graph.node}
    for k in range(3):
        stats = gen_timeline.read_step_stats(out / f"timeline-{k}")
        assert sorted(d.device for d in stats.dev_stats) == [ORT_DEVICE, PROCESSOR_DEVICE]
        doc = json.loads(json.dumps(gen_timeline.chrome_trace(stats, source=str(out / f"timeline-{k}"))))
        check_chrome_trace(doc)
        ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "processor stage"]
        assert {e["args"]["device"] for e in ops} == {ORT_DEVICE}
        assert len({e["name"] for e in ops} & onnx_nodes) >= 20, sorted(e["name"] for e in ops)
        assert {"Gather", "Mod", "Sigmoid"} <= {e["cat"] for e in ops}
        assert {"Gemm", "FusedGemm"} & {e["cat"] for e in ops}
        stages = {e["name"]: e for e in doc["traceEvents"] if e.get("cat") == "processor stage"}
        assert set(stages) == STAGES | {"trace_setup", "trace_collect"}
        run, setup, collect = stages["run"], stages["trace_setup"], stages["trace_collect"]
        # the profiled run lies inside run, between the tracing's set-up (with a warm-up) and collection
        assert all(setup["ts"] + setup["dur"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= collect["ts"] + 1
                   for e in ops)
        assert run["ts"] - 1 <= setup["ts"] and collect["ts"] + collect["dur"] <= run["ts"] + run["dur"] + 1
        lane = stages["request"]["tid"]  # the processor's stages sit on the lane's track
        threads = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
        assert f"lane {lane}: calling thread" in threads, threads  # the request's thread ran the ops

    assert_summary_ranks_heaviest_first([str(out / f"timeline-{k}") for k in range(3)])
    assert not list((tmp_path / "tmp").rglob("*.json"))  # profile files are deleted after each trace
    p.close()
    assert not list((tmp_path / "tmp").iterdir())  # and the profile directory with the model


def test_onnxruntime_run_errors_are_the_untraced_ones(ctr_model_small, make_processor, tmp_path, monkeypatch):
    from demo.synthetic_data import synthetic_batch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    p = make_processor(timeline_config(ctr_model_small, tmp_path / "tl", start=0, interval=1, count=1,
                                       backend="onnxruntime", use_per_session_threads=True))
    feeds = dict(synthetic_batch(4, 1), dense=synthetic_batch(3, 1)["dense"])  # batch 3 vs 4: ORT fails
    status, body = p.process(codec.encode_request(feeds))  # step 0: traced
    assert status == 500 and b"features/concat" in body
    assert p.process(codec.encode_request(feeds)) == (status, body)  # untraced: the same answer
    assert p.tracer.flush(30)
    stats = gen_timeline.read_step_stats(tmp_path / "tl" / "timeline-0")
    assert [d.device for d in stats.dev_stats] == [PROCESSOR_DEVICE]
    assert "error=" in next(n.timeline_label for n in stats.dev_stats[0].node_stats if n.node_name == "request")
    assert not list((tmp_path / "tmp").rglob("*.json"))


def test_failed_requests_are_traced_and_write_errors_never_fail_requests(ctr_model_small, make_processor,
                                                                         tmp_path):
    from demo.synthetic_data import synthetic_batch

    out = tmp_path / "tl"
    p = make_processor(timeline_config(ctr_model_small, out, start=0, interval=1, count=5))
    good = codec.encode_request(synthetic_batch(4, 1))
    expected = untraced(p, good)  # untraced path
    bad = codec.encode_request({k: v for k, v in synthetic_batch(4, 1).items() if k != "dense"})

    status, body = p.process(bad)  # step 0: traced, fails in decode
    assert status == 400 and b"dense" in body
    assert p.process(good) == (200, expected)  # step 1
    assert p.tracer.flush(30)
    failed = gen_timeline.read_step_stats(out / "timeline-0")
    assert [d.device for d in failed.dev_stats] == [PROCESSOR_DEVICE]  # no engine run
    request = next(n for n in failed.dev_stats[0].node_stats if n.node_name == "request")
    assert "error=" in request.timeline_label and "dense" in request.timeline_label
    assert {n.node_name for n in failed.dev_stats[0].node_stats} == {"request", "parse", "acquire", "decode"}

    shutil.rmtree(out)
    out.write_bytes(b"the trace directory is now a file")  # every later write fails
    for _ in range(5):  # steps 2, 3, 4 traced, then untraced
        assert p.process(good) == (200, expected)
    assert p.tracer.flush(30)
    info = p.model_info()["timeline"]
    assert (info["traced"], info["written"], info["write_errors"]) == (5, 2, 3)
    assert info["last_error"]


def test_bad_timeline_path_fails_initialize(ctr_model_small, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    config = json.dumps(timeline_config(ctr_model_small, blocker / "timelines", start=0, interval=1, count=1))
    with pytest.raises(ProcessorError, match="timeline_path") as err:
        abi.initialize("m", config)
    assert str(blocker / "timelines") in err.value.message
    config = json.dumps(timeline_config(ctr_model_small, "/rel", start=0, interval=1, count=1)).replace(
        '"/rel"', '"relative/dir"')
    with pytest.raises(ProcessorError, match="timeline_path"):
        abi.initialize("m", config)


@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_concurrent_requests_remote_store(ctr_model_small, make_processor, backend):
    from demo.synthetic_data import synthetic_batch

    url = f"memory://timeline-it/{backend}"
    p = make_processor(timeline_config(ctr_model_small, url, start=10, interval=7, count=5, backend=backend,
                                       session_num=2, use_per_session_threads=True, select_session_policy="RR"))
    requests = [codec.encode_request(synthetic_batch(2, seed)) for seed in range(4)]
    expected = [untraced(p, r) for r in requests]
    errors: list[str] = []

    def worker(i: int) -> None:
        for n in range(30):
            k = (i + n) % len(requests)
            status, body = p.process(requests[k])
            if status != 200 or body != expected[k]:
                errors.append(f"thread {i} call {n}: {status} {body[:200]!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert p.tracer.flush(30)
    fs = fsspec.filesystem("memory")
    names = sorted(x.rsplit("/", 1)[1] for x in fs.ls(f"/timeline-it/{backend}", detail=False))
    assert names == [f"timeline-{k}" for k in range(5)]
    steps = set()
    for name in names:
        stats = step_stats.parse(fs.cat(f"/timeline-it/{backend}/{name}"))
        stage = next(d for d in stats.dev_stats if d.device == PROCESSOR_DEVICE)
        label = next(n.timeline_label for n in stage.node_stats if n.node_name == "request")
        steps.add(int(label.split("step=")[1].split(",")[0]))
        assert len(stats.dev_stats) == 2 and all(d.node_stats for d in stats.dev_stats)
        if backend == "onnxruntime":
            assert {d.device for d in stats.dev_stats} == {ORT_DEVICE, PROCESSOR_DEVICE}
    assert steps == {10, 17, 24, 31, 38}
    fs.rm(f"/timeline-it/{backend}", recursive=True)


def test_a_store_served_model_traces_and_answers_as_untraced(ctr_model_small, make_processor, tmp_path):
    """Embeddings from the DRAM store (the split run): untraced requests run the two graph
    runs as C++ callables, traced ones the options-taking callables; both answer alike and the
    trace holds the second run's ops."""
    from demo.synthetic_data import synthetic_batch

    out = tmp_path / "timelines"
    p = make_processor(timeline_config(ctr_model_small, out, start=1, interval=2, count=2, ev_storage_type=1,
                                       session_num=2))
    requests = [codec.encode_request(synthetic_batch(8, seed)) for seed in range(6)]
    bodies = []
    for request in requests:
        status, body = p.process(request)
        assert status == 200, body
        bodies.append(body)
    assert p.tracer.flush(30)
    assert p.model_info()["timeline"]["written"] == 2
    for i, request in enumerate(requests):  # tracing is done: these run untraced
        got, want = codec.decode_response(p.process(request)[1]), codec.decode_response(bodies[i])
        assert_outputs_close(got, want)
        assert_outputs_close(want, codec.decode_response(untraced(p, request)))
    stats = gen_timeline.read_step_stats(out / "timeline-0")
    ops = {n.node_name for d in stats.dev_stats if d.device != PROCESSOR_DEVICE for n in d.node_stats}
    assert len(ops & graph_node_names(ctr_model_small.savedmodel_dir)) >= 10, sorted(ops)
