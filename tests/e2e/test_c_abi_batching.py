"""Server-side batching through the C ABI (issue 13): the real ``libserving_processor.so`` loaded
with ctypes into this process (the library joins this interpreter), on both backends.

``batch_process`` with batching on answers what ``process`` answers one request at a time
without batching (same statuses; the same outputs within float rounding, since a merged matmul
may round differently); a bad request among them fails alone, with the same message. Concurrent
``process`` calls on a batching handle are merged too, on the direct path (queued on the native
queue from C, without the GIL: ``processor/processor.py``), which follows the served version
through a pin and a rollback, steps aside for an update and for a traced model, and leaves what
it does not take (a ping, a bad request) to Python. The C ABI has no model info beyond the
checkpoint path, so the merged batches are read from the ``Processor`` behind the handle, which
lives in this interpreter.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from c_abi_ctypes import NativeProcessor  # noqa: E402
from processor import codec  # noqa: E402
from test_c_abi import native_build, pytestmark  # noqa: E402, F401  (the build fixture, its skip)
from sp_checks import assert_outputs_close  # noqa: E402
from test_server_batching import BACKENDS, backend_config, batching, demo_inputs  # noqa: E402


@pytest.fixture(scope="module")
def native(native_build) -> NativeProcessor:  # noqa: F811
    return NativeProcessor(native_build["lib"])


@pytest.fixture(scope="module", params=BACKENDS)
def handles(request, native, ctr_model_small):
    """(unbatched handle, batching handle, the batching handle's Processor) on one backend."""
    backend = request.param
    plain_config = backend_config(ctr_model_small, backend)
    batched_config = backend_config(ctr_model_small, backend, session_num=2, batching=batching(
        max_batch_size=64, batch_timeout_micros=50_000, allowed_batch_sizes=[8, 32, 64]))
    made = []
    try:
        for entry, config in ((f"plain-{backend}", plain_config), (f"batched-{backend}", batched_config)):
            handle, state = native.initialize(json.dumps(config), entry=entry)
            assert state == 0 and handle, native.last_error()
            made.append(handle)
        yield made[0], made[1], processor_named(f"batched-{backend}")
    finally:
        for handle in made:
            native.finalize(handle)


def processor_named(name: str):
    """The Processor the library created for model entry ``name`` (it lives in this interpreter)."""
    from processor.processor import Processor

    found = [o for o in gc.get_objects() if isinstance(o, Processor) and o.name == name]
    assert len(found) == 1, f"{len(found)} Processors named {name!r}"
    return found[0]


def assert_same_answer(got: tuple[int, bytes | None], want: tuple[int, bytes | None], what: str) -> None:
    """Same status; 200: the same outputs within rounding; an error: the same message."""
    assert got[0] == want[0], (what, got, want)
    if want[0] != 200 or got[1] == want[1]:
        assert got[1] == want[1], what
        return
    assert_outputs_close(codec.decode_response(got[1]), codec.decode_response(want[1]), what)


def bad_dtype() -> bytes:
    inputs = demo_inputs(2, seed=77)
    return codec.encode_request({**inputs, "dense": inputs["dense"].astype(np.float64)})


def test_batch_process_equals_process_unbatched_and_a_bad_request_fails_alone(native, handles):
    plain, batched, processor = handles
    before = processor.model_info()["batching"]
    requests = [codec.encode_request(demo_inputs(1 + i % 3, seed=500 + i)) for i in range(16)]
    requests[5] = bad_dtype()
    requests[11] = b""  # DeepRec's ping: the signature, in its place among the answers
    expected = [native.process(plain, data) for data in requests]
    assert [s for s, _ in expected] == [400 if i == 5 else 200 for i in range(16)]
    assert b"dtype" in expected[5][1]

    rc, items = native.batch_process(batched, requests)

    assert rc == 400  # one entry failed
    assert len(items) == len(requests)
    for i, (got, want) in enumerate(zip(items, expected)):
        assert_same_answer(got, want, f"request {i}")
    assert json.loads(items[11][1])["signature_name"] == "serving_default"

    after = processor.model_info()["batching"]
    requests_run = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    assert requests_run == 14  # the bad one fails before it is queued; the ping is no prediction
    assert 1 <= batches < requests_run, after  # merged
    assert after["rows"] - before["rows"] == sum(1 + i % 3 for i in range(16) if i not in (5, 11))
    assert after["run_alone"] == before["run_alone"] and after["isolated_retries"] == before["isolated_retries"]
    assert after["queued_requests"] == 0


def test_concurrent_process_calls_on_a_batching_handle_are_merged(native, handles):
    plain, batched, processor = handles
    before = processor.model_info()["batching"]
    threads_n, calls = 8, 4
    requests = {(t, c): codec.encode_request(demo_inputs(1 + (t + c) % 2, seed=700 + t * calls + c))
                for t in range(threads_n) for c in range(calls)}
    expected = {key: native.process(plain, data) for key, data in requests.items()}
    results: dict = {}
    start = threading.Barrier(threads_n)

    def worker(t: int) -> None:
        start.wait()
        for c in range(calls):
            results[t, c] = native.process(batched, requests[t, c])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == len(requests)
    for key, want in expected.items():
        assert want[0] == 200
        assert_same_answer(results[key], want, f"thread {key[0]} call {key[1]}")

    after = processor.model_info()["batching"]
    merged = after["requests"] - before["requests"]
    assert merged == len(requests) and after["batches"] - before["batches"] < merged, after
    assert after["native_queue"] is True


def concurrent(native, handle, requests: dict, threads_n: int) -> dict:
    """Every request of ``requests`` ((thread, call) -> bytes) through ``process`` from its thread."""
    results: dict = {}
    start = threading.Barrier(threads_n)

    def worker(t: int) -> None:
        start.wait()
        for (tt, c), data in sorted(requests.items()):
            if tt == t:
                results[tt, c] = native.process(handle, data)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_the_direct_path_answers_batched_calls_and_leaves_the_rest_to_python(native, handles):
    plain, batched, processor = handles
    before = processor.model_info()["direct"]
    requests = {(t, c): codec.encode_request(demo_inputs(1 + c % 2, seed=900 + t * 3 + c))
                for t in range(6) for c in range(3)}
    requests[0, 0], requests[1, 1] = b"", bad_dtype()  # a ping and a bad request: Python's
    expected = {key: native.process(plain, data) for key, data in requests.items()}
    results = concurrent(native, batched, requests, 6)
    for key, want in expected.items():
        assert_same_answer(results[key], want, f"call {key}")
    after = processor.model_info()["direct"]
    # the ping never reaches the front (empty); the bad request is refused by the queue's checks
    assert after["served"] - before["served"] == len(requests) - 2, (before, after)
    assert after["not_taken"] - before["not_taken"] == 1, (before, after)


def test_the_direct_path_follows_the_served_version_and_steps_aside_for_an_update(native, handles, ctr_model_small):
    plain, batched, processor = handles
    manager = processor.manager
    steps = sorted({int(p.name.rsplit("-", 1)[1]) for p in ctr_model_small.checkpoint_prefixes})
    request = codec.encode_request(demo_inputs(2, seed=31))
    try:
        answers = {}
        for step in steps:  # each version in turn: the direct path answers as that version does
            manager.pin(step)
            want = codec.decode_response(processor.process(request, direct=False)[1])  # through the DataPlane
            served = processor.model_info()["direct"]["served"]
            got = native.process(batched, request)
            assert got[0] == 200 and processor.model_info()["direct"]["served"] == served + 1
            answers[step] = codec.decode_response(got[1])
            assert_outputs_close(answers[step], want, f"step {step}")
        first, last = answers[steps[0]], answers[steps[-1]]
        assert any(not np.allclose(first[k], last[k]) for k in first), "the versions answer alike"
        # an update in progress: the lane closes (direct calls wait at the update gate in Python)
        with manager.acquire() as live:
            lane = live.open_direct_lane()
            lane.close()
            try:
                served = processor.model_info()["direct"]["served"]
                assert native.process(batched, request)[0] == 200  # answered through Python
                assert processor.model_info()["direct"]["served"] == served
            finally:
                lane.open()
        assert native.process(batched, request)[0] == 200
        assert processor.model_info()["direct"]["served"] == served + 1
    finally:
        manager.unpin()


def test_the_asynchronous_direct_path_answers_as_the_blocking_one(native, handles):
    """``submit`` (direct_api.h ABI 2, what the native gRPC server calls: completed on the batch
    thread, no thread waiting) answers what ``serve`` answers, merges concurrent calls, hands back
    a call whose deadline passed before its batch ran, and takes nothing while the lane is closed."""
    _plain, _batched, processor = handles
    front = processor._direct
    requests = [codec.encode_request(demo_inputs(1 + k % 3, seed=1300 + k)) for k in range(12)]
    want = [processor.process(r, direct=False) for r in requests]
    got: list = [None] * len(requests)
    before = front.stats()

    def call(k: int) -> None:
        got[k] = front.submit(requests[k], time.monotonic() + 60)
    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k, answer in enumerate(got):
        assert answer is not None, f"call {k} not taken"
        assert_same_answer((200, answer), want[k], f"call {k}")
    assert front.stats()["served"] - before["served"] == len(requests)
    # a deadline already passed: handed back unrun (Python answers DEADLINE_EXCEEDED)
    assert front.submit(requests[0], time.monotonic() - 1) is None
    assert front.stats()["not_taken"] == before["not_taken"] + 1
    with processor.manager.acquire() as live:  # an update in progress: nothing taken
        lane = live.open_direct_lane()
        lane.close()
        try:
            assert front.submit(requests[1]) is None
        finally:
            lane.open()
    assert_same_answer((200, front.submit(requests[1])), want[1], "after the update")
