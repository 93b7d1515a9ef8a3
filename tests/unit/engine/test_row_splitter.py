"""RowSplitter inside a real SessionGroup over a fake backend (our own logic, fast): chunks and
inputs passed whole, joined order, the first failing chunk's error with nothing left running,
outputs not per row, the row limit, the wire length threshold, and deltas during split requests
(every response is one published version)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from processor.checkpoint.delta import Delta
from processor.dtypes import DT_FLOAT, DT_STRING
from processor.engine.session_group import SessionGroup
from processor.engine.splitting import RowSplitter
from processor.engine.update_gate import UpdateGate
from processor.errors import InvalidArgument, ResourceExhausted
from processor.signature import Signature, TensorSpec
from processor.store.model_version import ModelVersion

SIGNATURE = Signature("serving_default",
                      {"x": TensorSpec("x", "x:0", DT_FLOAT, (-1, 2)),
                       "s": TensorSpec("s", "s:0", DT_STRING, (-1,)),
                       "k": TensorSpec("k", "k:0", DT_FLOAT, (1,))},
                      {"y": TensorSpec("y", "y:0", DT_FLOAT, (-1,)),
                       "total": TensorSpec("total", "total:0", DT_FLOAT, ())})


class RowBackend:
    """y = x[:, 0] + len(s) + k + w (w: the 'weights', written by deltas one element at a
    time); ``total``: one value for the whole call (not per row). A row with x < 0 fails its call,
    naming the row's x. Records the lanes and rows of each call, and how many run at once."""

    fingerprinted_inputs = ()

    def __init__(self, lanes: int = 2, delay: float = 0.0) -> None:
        self.lanes = lanes
        self.signature = SIGNATURE
        self.delay = delay
        self.w = np.zeros(64)
        self.calls: list[tuple[int, int, tuple]] = []
        self.running = 0
        self._lock = threading.Lock()

    def wire_server(self, codec):
        return None

    def run(self, lane, feeds, fetches):
        with self._lock:
            self.running += 1
            self.calls.append((lane, feeds["x"].shape[0], feeds["k"].shape))
        try:
            if self.delay:
                time.sleep(self.delay)
            x = feeds["x"]
            if (x < 0).any():
                raise InvalidArgument(f"negative x {x[x < 0][0]}")
            y = (x[:, 0] + np.array([len(v) for v in feeds["s"]]) + feeds["k"][0] + self.w.sum()).astype(np.float32)
            out = {"y": y, "total": np.float32(y.sum())}
            return [out[f] for f in fetches]
        finally:
            with self._lock:
                self.running -= 1

    def apply_delta(self, delta: Delta) -> None:
        value = delta.dense["w"]
        for i in range(len(self.w)):  # a mixed read would see part of it
            self.w[i] = value / len(self.w)
            time.sleep(0.0001)

    def update_gate(self) -> UpdateGate:
        return UpdateGate()

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def group_of(backend: RowBackend, chunk: int | None = 7, max_rows: int | None = None) -> SessionGroup:
    return SessionGroup(backend, "MOD", ModelVersion(1, 0), 0.0,
                        splitter=RowSplitter(chunk, max_rows, backend.lanes))


def feeds_of(n: int) -> dict[str, np.ndarray]:
    x = np.stack([np.arange(n, dtype=np.float32), np.ones(n, np.float32)], axis=1)
    s = np.array([b"a" * (i % 5) for i in range(n)], dtype=object)
    return {"x": x, "s": s, "k": np.array([100.0], np.float32)}


def expected(n: int) -> np.ndarray:
    return (np.arange(n) + np.array([i % 5 for i in range(n)]) + 100).astype(np.float32)


@pytest.mark.parametrize("n", [1, 6, 7, 8, 13, 14, 15, 22, 50])
def test_split_answer_equals_whole_in_order(n):
    backend = RowBackend()
    group = group_of(backend)
    try:
        (y,) = group.run(feeds_of(n), ("y",))
        np.testing.assert_array_equal(y, expected(n))
        chunks = -(-n // 7)
        sizes = sorted(rows for _, rows, _ in backend.calls)
        assert len(sizes) == chunks and sum(sizes) == n and max(sizes) <= 7
        assert max(sizes) - min(sizes) <= 1  # near-equal chunks
        assert all(k == (1,) for _, _, k in backend.calls)  # a fixed first dimension goes whole
        info = group.describe()["splitting"]
        assert (info["split_requests"], info["chunks_run"]) == ((1, chunks) if chunks > 1 else (0, 0))
        assert {lane for lane, _, _ in backend.calls} <= {0, 1}
    finally:
        group.close()


def test_first_failing_chunk_fails_the_request_and_nothing_runs_after():
    backend = RowBackend(delay=0.01)
    group = group_of(backend)
    try:
        feeds = feeds_of(50)
        feeds["x"][[23, 45], 0] = [-23, -45]  # chunks 3 and 6 of 7
        with pytest.raises(InvalidArgument, match="negative x -23"):
            group.run(feeds, ("y",))
        assert backend.running == 0
        (y,) = group.run(feeds_of(50), ("y",))  # the group still serves
        np.testing.assert_array_equal(y, expected(50))
    finally:
        group.close()


def test_outputs_not_per_row_run_the_request_whole():
    backend = RowBackend()
    group = group_of(backend)
    try:
        y, total = group.run(feeds_of(20), ("y", "total"))
        np.testing.assert_array_equal(y, expected(20))
        assert total == pytest.approx(expected(20).sum())
        assert group.describe()["splitting"]["run_whole"] == 1
        backend.calls.clear()
        group.run(feeds_of(20), ("y",))  # that signature is no longer split
        assert [rows for _, rows, _ in backend.calls] == [20]
    finally:
        group.close()


def test_row_limit_refuses_naming_it_before_running():
    backend = RowBackend()
    group = group_of(backend, chunk=None, max_rows=10)
    try:
        with pytest.raises(ResourceExhausted, match=r"11 rows, over the model's max_request_rows \(10\)"):
            group.run(feeds_of(11), ("y",))
        assert backend.calls == []
        (y,) = group.run(feeds_of(10), ("y",))  # at the limit: runs whole (no chunk size)
        np.testing.assert_array_equal(y, expected(10))
        assert group.describe()["splitting"]["refused_requests"] == 1
    finally:
        group.close()


def test_wire_threshold_is_the_fewest_bytes_of_a_request_over_the_limit():
    # x: 2 floats (8 bytes) a row, s: >= 1 byte a row; k has a fixed first dimension
    assert RowSplitter(7, None, 2).wire_bytes(SIGNATURE) == 7 * 9
    assert RowSplitter(7, 5, 2).wire_bytes(SIGNATURE) == 5 * 9
    fixed = Signature("f", {"k": TensorSpec("k", "k:0", DT_FLOAT, (3,))}, {})
    assert RowSplitter(7, None, 2).wire_bytes(fixed) > 1 << 60  # never leaves the native path


def test_deltas_during_split_requests_never_mix_versions():
    backend = RowBackend(delay=0.001)
    group = group_of(backend)
    published = [0.0]
    stop = threading.Event()
    answers: list[np.ndarray] = []

    def updates() -> None:
        value = 0.0
        while not stop.is_set():
            value += 1000.0
            group.apply_delta(Delta(int(value), dense={"w": value}), ModelVersion(1, 0))
            published.append(value)
            time.sleep(0.005)  # the gate prefers writers: leave the readers room

    def requests() -> None:
        for _ in range(30):
            (y,) = group.run(feeds_of(40), ("y",))
            answers.append(y - expected(40))

    try:
        writer = threading.Thread(target=updates)
        readers = [threading.Thread(target=requests) for _ in range(3)]
        writer.start()
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        stop.set()
        writer.join()
    finally:
        group.close()
    assert len(published) > 2  # deltas landed while requests ran
    for offset in answers:
        assert np.allclose(offset, offset[0], atol=1e-3), "one response saw two versions"
        assert min(abs(offset[0] - v) for v in published) < 1e-2
