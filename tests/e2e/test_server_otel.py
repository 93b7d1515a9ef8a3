"""OpenTelemetry traces (issue 46) end to end: a real ServingApp (HTTP and gRPC, in a thread)
serving the DLRM-like ``.onnx`` model exports over OTLP, gRPC and HTTP/protobuf, to receivers
of OpenTelemetry's own protocol in this process (``tools.otlp_receiver``).

A caller's ``traceparent`` continues through the edge span (its parent is the caller's span)
and the DataPlane's spans under it, on our wire format over both transports (HTTP's ASGI and
lean paths) and TF Serving REST; the response names the edge span; sampling at 0 exports
nothing; loads are traces of their own; errors carry their status; the latency histogram's
exemplars are the trace ids; a batching model's requests link their batch; a collector that
refuses or hangs changes no answer, and its lost spans are counted in /metrics.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the server extra installs the OpenTelemetry SDK")

import grpc  # noqa: E402

from processor.codec import encode_request  # noqa: E402
from server.settings import DeploymentConfig  # noqa: E402
from processor.request import wire_call  # noqa: E402
from tools import otlp_receiver  # noqa: E402

MODEL = "dlrm"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
PREDICT = "/tensorflow.eas.ProcessorService/Predict"
DATAPLANE_SPANS = {"decode", "engine.run", "encode"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from demo import dlrm_onnx

    directory = tmp_path_factory.mktemp("otel") / "dlrm"
    dlrm_onnx.build(directory / "model.onnx", rows=500, dim=8)
    return directory


@pytest.fixture(scope="module")
def body():
    from demo import dlrm_onnx

    return encode_request(dlrm_onnx.inputs(1, seed=5))


@contextlib.contextmanager
def serving(model_dir, monkeypatch, tracing: dict, **model_keys):
    """A started ServingApp of the model with ``tracing``; stopped after."""
    from server.app import ServingApp

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms (the SDK's own variable)
    deployment = DeploymentConfig.from_dict({
        "models": [{"name": MODEL, "model_config": {
            "savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1, **model_keys}}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False, "tracing": tracing})
    app = ServingApp(deployment, announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    try:
        assert app.started.wait(60), "server did not start"
        app.runtime.wait_models(120)
        assert app.runtime.ready
        yield app
    finally:
        app.request_stop()
        thread.join(60)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture
def receiver(request):
    protocol, mode = getattr(request, "param", ("grpc", "ok"))
    r = otlp_receiver.start(protocol, mode)
    r.protocol = protocol
    yield r
    r.stop()


def http_predict(app, body: bytes, traceparent: str | None = None, path: str = f"/api/predict/{MODEL}",
                 content_type: str = "application/x-protobuf") -> tuple[int, dict, bytes]:
    headers = {"Content-Type": content_type}
    if traceparent:
        headers["traceparent"] = traceparent
    request = urllib.request.Request(f"http://127.0.0.1:{app.http_port}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def grpc_predict(app, body: bytes, traceparent: str | None = None) -> tuple[bytes, dict]:
    with grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        metadata = (("traceparent", traceparent),) if traceparent else ()
        answer, call = channel.unary_unary(PREDICT).with_call(body, metadata=metadata, timeout=30)
        return answer, dict(call.trailing_metadata())


def ids(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a ``traceparent`` value."""
    _, trace_id, span_id, flags = traceparent.split("-")
    assert flags in ("01", "03")  # sampled (and maybe the random trace id flag)
    return trace_id, span_id


def flush(app) -> None:
    app.runtime.otel.force_flush()


def metric(app, outcome: str) -> float:
    text = app.runtime.metrics.render().decode()
    m = re.search(rf'^sp_tracing_spans_total\{{outcome="{outcome}"\}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def the_request(spans, edge_span_id: str) -> dict[str, otlp_receiver.ReceivedSpan]:
    """The edge span ``edge_span_id`` and its children, by name."""
    edge = next(s for s in spans if s.span_id == edge_span_id)
    return {"edge": edge, **{s.name: s for s in spans if s.parent_span_id == edge_span_id}}


@pytest.mark.parametrize("receiver", [("grpc", "ok"), ("http/protobuf", "ok")], indirect=True,
                         ids=["otlp-grpc", "otlp-http"])
def test_a_callers_trace_continues_through_the_server(model_dir, monkeypatch, receiver, body):
    with serving(model_dir, monkeypatch, {"otlp_endpoint": receiver.endpoint, "protocol": receiver.protocol,
                                          "sample_rate": 0.0, "service_name": "recs"}) as app:
        answers, edges = [], []
        for _ in range(3):  # the first takes the ASGI path, the next ones the connection's lean path
            status, headers, answer = http_predict(app, body, CALLER)
            assert status == 200
            answers.append(answer)
            edges.append(("http", ids(headers["traceparent"])))
        answer, trailing = grpc_predict(app, body, CALLER)
        answers.append(answer)
        edges.append(("grpc", ids(trailing["traceparent"])))
        rest = json.dumps({"instances": [{"dense": [0.5] * 13, "sparse": list(range(26))}]}).encode()
        status, headers, _ = http_predict(app, rest, CALLER, path=f"/v1/models/{MODEL}:predict",
                                          content_type="application/json")
        assert status == 200
        tfs_edge = ids(headers["traceparent"])
        assert len(set(answers)) == 1  # tracing changes no answer
        spans = receiver.wait_for(lambda s: len(s) >= 5 * 4)
    assert {trace_id for _, (trace_id, _) in edges} | {tfs_edge[0]} == {CALLER_TRACE}
    assert {s.trace_id for s in spans} == {CALLER_TRACE}  # sampling 0: no load trace, only the caller's
    for protocol, (_, span_id) in edges:
        got = the_request(spans, span_id)
        edge = got["edge"]
        assert edge.parent_span_id == CALLER_SPAN  # the caller's span is the edge span's parent
        assert edge.kind == 2  # SERVER
        assert set(got) - {"edge"} == DATAPLANE_SPANS
        assert edge.name == ("POST predict" if protocol == "http" else "tensorflow.eas.ProcessorService/Predict")
        assert {k: edge.attributes[k] for k in ("sp.protocol", "sp.route", "sp.model", "sp.status", "sp.model.version")} \
            == {"sp.protocol": protocol, "sp.route": "predict", "sp.model": MODEL, "sp.status": "OK",
                "sp.model.version": "savedmodel"}
        assert edge.attributes["sp.request.bytes"] == len(body)
        assert edge.attributes["sp.response.bytes"] == len(answers[0])
        engine = got["engine.run"]
        assert engine.attributes["sp.backend"] == "onnxruntime" and engine.attributes["sp.rows"] == 1
        assert engine.attributes["sp.lane"] in (0, 1)
        assert edge.start_ns <= got["decode"].start_ns <= got["engine.run"].start_ns <= got["encode"].start_ns
        assert got["encode"].end_ns <= edge.end_ns
    tfs = the_request(spans, tfs_edge[1])
    assert tfs["edge"].parent_span_id == CALLER_SPAN and tfs["edge"].attributes["sp.route"] == "tfs_predict"
    assert {"parse", "decode", "engine.run"} <= set(tfs)
    resource = spans[0].resource
    assert resource["service.name"] == "recs" and resource["service.instance.id"]


def test_sampling_at_zero_traces_nothing(model_dir, monkeypatch, receiver, body):
    with serving(model_dir, monkeypatch, {"otlp_endpoint": receiver.endpoint, "sample_rate": 0.0}) as app:
        unsampled = f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"
        for traceparent in (None, unsampled) * 10:
            status, headers, _ = http_predict(app, body, traceparent)
            assert status == 200 and "traceparent" not in headers
            _, trailing = grpc_predict(app, body, traceparent)
            assert "traceparent" not in trailing
        flush(app)
        assert receiver.spans() == [] and receiver.exports == 0
        assert metric(app, "exported") == 0


def test_a_model_load_is_a_trace_of_its_own(model_dir, monkeypatch, receiver):
    with serving(model_dir, monkeypatch, {"otlp_endpoint": receiver.endpoint, "sample_rate": 1.0}):
        spans = receiver.wait_for(lambda s: any(x.name == "model.load" for x in s))
    load = next(s for s in spans if s.name == "model.load")
    assert load.parent_span_id == ""  # a root
    assert load.attributes["sp.model"] == MODEL and load.attributes["sp.backend"] == "onnxruntime"
    steps = {s.name: s for s in spans if s.parent_span_id == load.span_id}
    assert set(steps) == {"materialize", "open", "warmup"}
    assert steps["warmup"].attributes["sp.warmup.runs"] > 0


def test_errors_set_the_span_status(model_dir, monkeypatch, receiver, body):
    with serving(model_dir, monkeypatch, {"otlp_endpoint": receiver.endpoint, "sample_rate": 0.0}) as app:
        status, headers, answer = http_predict(app, b"\x0a\x03bad", CALLER)
        assert status == 400
        bad = ids(headers["traceparent"])[1]
        with pytest.raises(grpc.RpcError) as err:
            with grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
                channel.unary_unary(PREDICT)(body, metadata=(("traceparent", CALLER), ("model-name", "nah")),
                                             timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        spans = receiver.wait_for(lambda s: any(x.span_id == bad for x in s)
                                  and any(x.attributes.get("sp.status") == "NOT_FOUND" for x in s))
    edge = next(s for s in spans if s.span_id == bad)
    assert edge.status_code == 2 and edge.attributes["sp.status"] == "INVALID_ARGUMENT"
    assert edge.status_message == json.loads(answer)["error"]
    missing = next(s for s in spans if s.attributes.get("sp.status") == "NOT_FOUND")
    assert missing.status_code == 2 and "nah" in missing.status_message


def test_latency_exemplars_are_the_trace_ids(model_dir, monkeypatch, receiver, body):
    with serving(model_dir, monkeypatch, {"otlp_endpoint": receiver.endpoint, "sample_rate": 1.0}) as app:
        _, headers, _ = http_predict(app, body)
        trace_id, span_id = ids(headers["traceparent"])
        request = urllib.request.Request(f"http://127.0.0.1:{app.http_port}/metrics",
                                         headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.headers["content-type"].startswith("application/openmetrics-text")
            text = resp.read().decode()
    buckets = [line for line in text.splitlines() if line.startswith("sp_request_latency_seconds_bucket")
               and 'protocol="http"' in line and "# {" in line]
    assert any(f'trace_id="{trace_id}"' in line and f'span_id="{span_id}"' in line for line in buckets)


def test_batched_requests_link_their_batch(model_dir, monkeypatch, receiver, body):
    batching = {"max_batch_size": 8, "batch_timeout_micros": 20_000, "num_batch_threads": 1}
    with serving(model_dir, monkeypatch, {"otlp_endpoint": receiver.endpoint, "sample_rate": 1.0},
                 batching=batching) as app:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: http_predict(app, body), range(16)))
        assert {status for status, _, _ in answers} == {200} and len({a for _, _, a in answers}) == 1
        edges = [ids(headers["traceparent"])[1] for _, headers, _ in answers]
        spans = receiver.wait_for(lambda s: sum(x.name == "batch.queue" for x in s) >= 16)
        # the OpenMetrics exposition takes every family (the batching histograms too)
        assert app.runtime.metrics.render(openmetrics=True).decode().endswith("# EOF\n")
    by_id = {s.span_id: s for s in spans}
    for edge in edges:
        engine = next(s for s in spans if s.name == "engine.run" and s.parent_span_id == edge)
        queue = next(s for s in spans if s.name == "batch.queue" and s.parent_span_id == engine.span_id)
        (link,) = queue.links
        batch = by_id[link[1]]
        assert batch.name == "batch.run" and batch.trace_id == link[0]
        assert (engine.trace_id, engine.span_id) in batch.links  # the batch links back
        assert queue.end_ns == batch.start_ns
        assert 1 <= batch.attributes["sp.rows"] <= 8 and batch.attributes["sp.backend"] == "onnxruntime"


@pytest.mark.parametrize("receiver", [("grpc", "refuse"), ("grpc", "hang"), ("http/protobuf", "refuse"),
                                      ("http/protobuf", "hang")], indirect=True,
                         ids=["grpc-refuses", "grpc-hangs", "http-refuses", "http-hangs"])
def test_a_collector_that_refuses_or_hangs_changes_no_answer(model_dir, monkeypatch, receiver, body):
    tracing = {"otlp_endpoint": receiver.endpoint, "protocol": receiver.protocol, "sample_rate": 1.0,
               "max_queue_size": 16, "max_export_batch_size": 4, "export_timeout_seconds": 1.0}
    with serving(model_dir, monkeypatch, tracing) as app:
        expected = app.runtime.dataplane.predict(wire_call(MODEL, body)).outputs
        for _ in range(60):
            status, headers, answer = http_predict(app, body, CALLER)
            assert (status, answer) == (200, expected) and headers["traceparent"].startswith(f"00-{CALLER_TRACE}-")
        for _ in range(20):
            answer, _ = grpc_predict(app, body, CALLER)
            assert answer == expected
        receiver.wait_exports(1)
        lost = "dropped" if receiver.mode == "hang" else "export_failed"
        deadline = threading.Event()
        for _ in range(300):  # the exporter gives up on its own clock (export_timeout_seconds)
            if metric(app, lost) > 0:
                break
            deadline.wait(0.1)
        assert metric(app, lost) > 0
        assert metric(app, "exported") == 0


def test_each_worker_exports_as_an_instance_of_its_own(model_dir, tmp_path, receiver, body):
    from tools.server_process import ServerProcess

    config = {"savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 1}
    deployment = {"models": [{"name": MODEL, "model_config": config}], "workers": 2, "access_log": False,
                  "drain_timeout_seconds": 10,
                  "tracing": {"otlp_endpoint": receiver.endpoint, "sample_rate": 1.0, "service_name": "recs"}}
    with ServerProcess(deployment, tmp_path, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}) as server:
        for _ in range(4):  # a new connection each: either worker answers
            request = urllib.request.Request(server.http + f"/api/predict/{MODEL}", data=body)
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert resp.status == 200 and resp.headers["traceparent"]
        # each worker loads the model: its load trace names the instance that exported it
        spans = receiver.wait_for(lambda s: len({x.resource["service.instance.id"] for x in s
                                                 if x.name == "model.load"}) == 2
                                  and sum(x.name == "POST predict" for x in s) == 4)
    loads = [s for s in spans if s.name == "model.load"]
    assert {s.resource["service.name"] for s in loads} == {"recs"}
    assert len({s.resource["process.pid"] for s in loads}) == 2
