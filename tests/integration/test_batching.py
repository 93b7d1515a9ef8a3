"""Server-side batching on the real engines: merged answers equal unbatched ones, a bad request
fails alone, updates under batched load, traces. Both engines batch in the native queue
(``native/src/batcher.h``; ONNX Runtime without Python, TensorFlow through one Python call per
batch); what it does not take goes through :mod:`processor.batching.batcher`. Front-ends and the
C library: tests/e2e/test_server_batching.py, test_c_abi_batching.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import model_config
from processor import codec
from sp_checks import run_threads, wait_for

CTR_BATCHING = {"max_batch_size": 16, "batch_timeout_micros": 5000, "num_batch_threads": 2}


def concurrently(call, items, threads: int = 16) -> list:
    """``call(item)`` for every item from ``threads`` threads at once; results in item order."""
    results: list = [None] * len(items)
    start = threading.Barrier(threads)

    def worker(k: int) -> None:
        start.wait()
        for i in range(k, len(items), threads):
            results[i] = call(items[i])

    run_threads(worker, threads)
    return results


def ctr_requests(count: int) -> list[bytes]:
    from demo.synthetic_data import synthetic_batch

    return [codec.encode_request(synthetic_batch(1 + i % 3, 100 + i)) for i in range(count)]


def assert_same_predictions(got: tuple[int, bytes], want: tuple[int, bytes]) -> None:
    assert got[0] == want[0] == 200, (got, want)
    a, b = codec.decode_response(got[1]), codec.decode_response(want[1])
    assert a.keys() == b.keys()
    for key in a:  # merged matrix products may round differently from one-row ones
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorflow"])
def test_merged_answers_equal_unbatched_ones(ctr_model_small, make_processor, backend):
    base = model_config(ctr_model_small, backend=backend, session_num=2, use_per_session_threads=True,
                        inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    plain = make_processor(base)
    batched = make_processor({**base, "batching": CTR_BATCHING})
    requests = ctr_requests(96)
    want = [plain.process(r) for r in requests]
    got = concurrently(batched.process, requests)
    for g, w in zip(got, want):
        assert_same_predictions(g, w)
    info = batched.model_info()["batching"]
    assert info["native_queue"] is True
    assert info["requests"] == 96 and info["batches"] < 96  # merged
    assert info["batch_rows"]["count"] == info["batches"] and info["queued_requests"] == 0


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorflow"])
def test_a_bad_request_in_a_crowd_fails_alone_with_its_own_error(ctr_model_small, make_processor, backend):
    from demo.synthetic_data import synthetic_batch

    # per-session pools: ONNX Runtime's global pools are process state that later tests must not inherit
    base = model_config(ctr_model_small, backend=backend, use_per_session_threads=True)
    plain = make_processor(base)
    batched = make_processor({**base, "batching": {**CTR_BATCHING, "batch_timeout_micros": 50_000}})
    good = ctr_requests(15)
    feeds = synthetic_batch(1, 7)
    bad_dtype = codec.encode_request({**feeds, next(iter(feeds)): np.zeros((1,), np.complex64)})
    unknown = codec.encode_request({**feeds, "no_such_input": np.zeros((1,), np.float32)})
    requests = good[:7] + [bad_dtype] + good[7:] + [unknown]
    got = concurrently(batched.process, requests)
    for request, answer in zip(requests, got):
        expected = plain.process(request)
        if request in (bad_dtype, unknown):
            assert answer == expected and answer[0] == 400, answer
        else:
            assert_same_predictions(answer, expected)


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorflow"])
def test_process_many_merges_with_concurrent_process_calls(ctr_model_small, make_processor, backend):
    """One queue per model: the C ABI's batch_process (``process_many``) and concurrent
    ``process`` calls fill one batch together. The batch runs only when full (8 rows; the
    timeout is far away), so one merged call means they met in the same queue."""
    base = model_config(ctr_model_small, backend=backend, use_per_session_threads=True)
    p = make_processor({**base, "batching": {"max_batch_size": 8, "batch_timeout_micros": 10_000_000,
                                             "num_batch_threads": 1}})
    plain = make_processor(base)
    requests = ctr_requests_of_one_row(8)
    before = p.model_info()["batching"]
    answers: dict = {}
    clients = [threading.Thread(target=lambda: answers.update(many=p.process_many(requests[:4])))]
    clients += [threading.Thread(target=lambda i=i: answers.update({i: p.process(requests[i])})) for i in range(4, 8)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    got = answers["many"] + [answers[i] for i in range(4, 8)]
    for g, request in zip(got, requests):
        assert_same_predictions(g, plain.process(request))
    after = p.model_info()["batching"]
    assert after["native_queue"] is True
    assert (after["batches"] - before["batches"], after["requests"] - before["requests"]) == (1, 8), after


def ctr_requests_of_one_row(count: int) -> list[bytes]:
    from demo.synthetic_data import synthetic_batch

    return [codec.encode_request(synthetic_batch(1, 900 + i)) for i in range(count)]


# --- every dtype the codec supports: merged bytes equal unbatched bytes ------------------------

NUMERIC = {  # alias: (dtype, trailing shape, op)
    "f32": (np.float32, (2,), lambda x, v: x * v),
    "f64": (np.float64, (), lambda x, v: x + 1.0),
    "i32": (np.int32, (), lambda x, v: x + 1),
    "i64": (np.int64, (3,), lambda x, v: x * 3),
    "i8": (np.int8, (), lambda x, v: x),
    "i16": (np.int16, (), lambda x, v: x),
    "u8": (np.uint8, (), lambda x, v: x),
    "u16": (np.uint16, (), lambda x, v: x),
    "b": (np.bool_, (), lambda x, v: x),
}


def build_dtype_model(path: Path, strings: bool) -> Path:
    """A TF1 SavedModel with one row-wise output per input dtype (string and half ones too when
    ``strings``): each output row depends on its input row only, so merged runs are exact."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", initializer=2.0, use_resource=True)
        inputs, outputs = {}, {}
        for alias, (dtype, trailing, op) in NUMERIC.items():
            x = tf.compat.v1.placeholder(tf.as_dtype(dtype), [None, *trailing], name=alias)
            inputs[alias] = x
            if alias == "b":
                outputs["out_" + alias] = tf.logical_not(x)
            else:
                y = op(x, tf.cast(v, x.dtype)) if alias == "f32" else op(x, None)
                outputs["out_" + alias] = tf.identity(y)
        if strings:
            s = tf.compat.v1.placeholder(tf.string, [None], name="s")
            h = tf.compat.v1.placeholder(tf.float16, [None], name="h")
            inputs.update(s=s, h=h)
            outputs.update(out_s=tf.strings.join([s, "!"]), out_h=h * tf.constant(2.0, tf.float16))
        saver = tf.compat.v1.train.Saver([v])
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], saver=saver, strip_default_attrs=True,
                signature_def_map={"serving_default":
                                   tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)})
            builder.save()
    return path


def dtype_request(rows: int, seed: int, strings: bool) -> bytes:
    rng = np.random.default_rng(seed)
    feeds = {}
    for alias, (dtype, trailing, _) in NUMERIC.items():
        shape = (rows, *trailing)
        if dtype is np.bool_:
            feeds[alias] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            feeds[alias] = rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
        else:
            feeds[alias] = rng.standard_normal(shape).astype(dtype)
    if strings:
        feeds["s"] = np.array([f"row-{seed}-{i}".encode() for i in range(rows)], object)
        feeds["h"] = rng.standard_normal(rows).astype(np.float16)
    return codec.encode_request(feeds)


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorflow"])
def test_every_dtype_merges_byte_identical(tmp_path, make_processor, backend):
    strings = backend == "tensorflow"  # ONNX cannot express the string op of this model
    model = build_dtype_model(tmp_path / "dtypes", strings)
    base = {"savedmodel_dir": str(model), "backend": backend, "session_num": 2, "use_per_session_threads": True}
    plain = make_processor(base)
    batched = make_processor({**base, "batching": {"max_batch_size": 12, "batch_timeout_micros": 20_000,
                                                   "allowed_batch_sizes": [4, 12]}})
    requests = [dtype_request(1 + i % 3, i, strings) for i in range(48)]
    want = [plain.process(r) for r in requests]
    assert all(status == 200 for status, _ in want), want[0]
    assert concurrently(batched.process, requests) == want
    info = batched.model_info()["batching"]
    assert info["batches"] < 48 and info["padding_rows"] >= 0
    assert info["native_queue"] is True


# --- updates under batched load ----------------------------------------------------------------

@pytest.fixture
def trainer(ctr_model_small, tmp_path):
    import shutil

    from demo.streaming_trainer import StreamingTrainer

    out = tmp_path / "model"
    shutil.copytree(ctr_model_small.out_dir, out)
    t = StreamingTrainer(out)
    yield t
    t.close()


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorflow"])
def test_deltas_under_batched_load_zero_failures_one_version_per_batch(trainer, make_processor, backend):
    """While deltas land: clients send single requests to one processor, and groups of 8 to
    another (``process_many``, as the C ABI's batch_process: 8 rows fill one batch, so each group
    is one merged call). Every answer is one version's; the 8 answers of a group all the same one's."""
    from demo.synthetic_data import synthetic_batch

    base = model_config(trainer.paths, backend=backend, file_system_poll_wait_seconds=0.2, session_num=2,
                        use_per_session_threads=True)
    singles_p = make_processor({**base, "batching": {"max_batch_size": 8, "batch_timeout_micros": 2000}})
    groups_p = make_processor({**base, "batching": {"max_batch_size": 8, "batch_timeout_micros": 5_000_000}})
    rows = [synthetic_batch(1, 500 + i) for i in range(8)]
    requests = [codec.encode_request(f) for f in rows]
    references = [[trainer.predict(f)["logits"] for f in rows]]  # per version, per row
    stop = threading.Event()
    failures, singles, groups = [], [], []

    def single_client(k: int) -> None:
        while not stop.is_set():
            status, body = singles_p.process(requests[k])
            (singles.append((k, codec.decode_response(body)["logits"])) if status == 200
             else failures.append(body))

    def group_client() -> None:
        while not stop.is_set():
            answers = groups_p.process_many(requests)
            if any(status != 200 for status, _ in answers):
                failures.extend(body for status, body in answers if status != 200)
            else:
                groups.append([codec.decode_response(body)["logits"] for _, body in answers])

    clients = [threading.Thread(target=single_client, args=(k,)) for k in range(4)]
    clients.append(threading.Thread(target=group_client))
    for c in clients:
        c.start()
    for _ in range(4):
        time.sleep(0.5)
        trainer.train(3)
        trainer.save_delta()
        references.append([trainer.predict(f)["logits"] for f in rows])
    assert wait_for(lambda: all(p.model_info()["version"]["label"].endswith(f"+{trainer.step}")
                                for p in (singles_p, groups_p)), timeout=30), "the last delta never served"
    landed_singles, landed_groups = len(singles), len(groups)

    def answered_since_landing(k: int) -> list:
        return [logits for i, logits in singles[landed_singles:] if i == k]

    # a few answers from the last version: two per client (its first may have started before)
    assert wait_for(lambda: all(len(answered_since_landing(k)) >= 2 for k in range(4))
                    and len(groups) >= landed_groups + 2, timeout=30), "no answers after the last delta"
    stop.set()
    for c in clients:
        c.join()
    assert failures == []
    assert singles_p.model_info()["updates"]["delta_updates"] >= 1
    for k, logits in singles:
        assert any(np.allclose(logits, ref[k], rtol=1e-5, atol=1e-6) for ref in references)
    for k in range(4):  # started after the last delta served: its values
        for logits in answered_since_landing(k)[1:]:
            np.testing.assert_allclose(logits, references[-1][k], rtol=1e-5, atol=1e-6)
    for answers in groups[landed_groups + 1:]:
        for k, a in enumerate(answers):
            np.testing.assert_allclose(a, references[-1][k], rtol=1e-5, atol=1e-6)
    assert groups and groups_p.model_info()["batching"]["batches"] == len(groups)  # one merged call each
    for answers in groups:
        assert any(all(np.allclose(a, ref[k], rtol=1e-5, atol=1e-6) for k, a in enumerate(answers))
                   for ref in references), "a merged call mixed versions"


def test_a_traced_request_shows_its_queue_wait_and_the_merged_run(ctr_model_small, make_processor, tmp_path):
    from processor.tracing import PROCESSOR_DEVICE
    from tools.timeline import gen_timeline

    out = tmp_path / "timelines"
    p = make_processor(model_config(ctr_model_small, backend="tensorflow", timeline_start_step=1,
                                    timeline_interval_step=1, timeline_trace_count=1, timeline_path=str(out),
                                    batching={"max_batch_size": 16, "batch_timeout_micros": 20_000}))
    requests = ctr_requests(6)
    plain = [p.process(r) for r in requests[:1]]  # step 0: untraced
    got = concurrently(p.process, requests[1:], threads=5)  # step 1 traced, merged with the others
    assert all(status == 200 for status, _ in plain + got)
    assert p.tracer.flush(30)
    stats = gen_timeline.read_step_stats(out / "timeline-0")
    stages = {n.node_name: n for d in stats.dev_stats if d.device == PROCESSOR_DEVICE for n in d.node_stats}
    assert {"request", "parse", "acquire", "decode", "queue", "run", "encode"} <= set(stages)
    queue, run = stages["queue"], stages["run"]
    assert run.all_start_micros <= queue.all_start_micros  # the wait is inside the run stage
    assert queue.all_start_micros + queue.all_end_rel_micros <= run.all_start_micros + run.all_end_rel_micros
    assert len([d for d in stats.dev_stats if d.device != PROCESSOR_DEVICE]) >= 1  # the engine's ops


def build_picky_model(path: Path) -> Path:
    """A TF1 SavedModel ``y = 2x`` that refuses (InvalidArgument) any batch holding a negative x."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", initializer=2.0, use_resource=True)
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        with tf.control_dependencies([tf.debugging.assert_non_negative(x, message="x must be >= 0")]):
            y = tf.identity(x * v, name="y")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(path))
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], saver=tf.compat.v1.train.Saver([v]), strip_default_attrs=True,
                signature_def_map={"serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})})
            builder.save()
    return path


def test_a_request_the_model_refuses_fails_alone_in_a_merged_call(tmp_path, make_processor):
    """The merged call fails (one request holds a value the model refuses): the native queue hands
    the batch back, the reference batcher retries request by request, only the culprit fails."""
    model = build_picky_model(tmp_path / "picky")
    base = {"savedmodel_dir": str(model), "backend": "tensorflow", "session_num": 2}
    plain = make_processor(base)
    batched = make_processor({**base, "batching": {"max_batch_size": 16, "batch_timeout_micros": 50_000}})
    values = [1.0, 2.0, -1.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    requests = [codec.encode_request({"x": np.array([[v]], np.float32)}) for v in values]
    got = concurrently(batched.process, requests, threads=8)
    for v, request, answer in zip(values, requests, got):
        want = plain.process(request)
        assert answer[0] == want[0] == (400 if v < 0 else 200), answer
        assert answer == want
    info = batched.model_info()["batching"]
    assert info["isolated_retries"] >= 1  # the reference batcher retried the batch request by request


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorflow"])
def test_a_call_queued_for_an_event_loop_notifies_its_fd_and_answers_as_unbatched(
        ctr_model_small, make_processor, backend):
    """``DataPlane.submit`` queues a batching model's wire call (server/batch_waiter.py awaits
    it): the native queue adds 1 to the notify fd once the ticket is answered; the answer is the
    unbatched one; while an update waits for the gate nothing is queued (an event loop must not
    wait for a delta): the call is deferred to a thread, holding its version."""
    from processor.batching.batched_call import BatchedCall
    from processor.dataplane import Deferred
    import os

    from processor.request import wire_call

    base = model_config(ctr_model_small, backend=backend, session_num=2, use_per_session_threads=True,
                        inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    plain = make_processor(base)
    batched = make_processor({**base, "batching": {**CTR_BATCHING, "batch_timeout_micros": 200_000}})
    requests = ctr_requests(3)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        calls = [batched.dataplane.submit(wire_call(batched.name, r), 0, fd) for r in requests]
        assert all(isinstance(c, BatchedCall) for c in calls)
        assert not any(c.ticket.done for c in calls)  # waiting for the batch's timeout
        assert wait_for(lambda: all(c.ticket.done for c in calls), 10), "the batch never ran"
        assert os.eventfd_read(fd) == 3  # one per answered ticket
        for call, request in zip(calls, requests):
            result = call.result()
            assert_same_predictions((200, result.outputs), plain.process(request))
        info = batched.model_info()["batching"]
        assert info["requests"] == 3 and info["batches"] == 1

        handle = batched.models.get(batched.name).manager.acquire_handle()
        try:
            with handle.group.gate.exclusive():  # an update writing
                deferred = batched.dataplane.submit(wire_call(batched.name, requests[0]), 0, fd)
                assert isinstance(deferred, Deferred)
        finally:
            handle.release()
        assert_same_predictions((200, deferred.run().outputs), plain.process(requests[0]))
    finally:
        os.close(fd)
