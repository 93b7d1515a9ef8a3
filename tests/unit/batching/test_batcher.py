"""The batching policy table, run against both queues over a fake group: the reference
(processor.batching.batcher.Batcher) and the native queue (native/src/batcher.h, through its
Python runner; requests go in as PredictRequest bytes and answers come back decoded). Merging,
padding, timeouts, isolation, back-pressure, deadlines, drain; and the one row budget both take
from. Where the native queue legitimately differs (it does not take a request, or hands a batch
back, for ModelBatching to give to the reference), the test says so. The real engines are in
tests/integration/test_batching.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fakes import FakeGroup
from processor import codec, native
from processor.batching import native_queue
from processor.batching.batcher import Batcher
from processor.batching.budget import RowBudget, new_budget
from processor.batching.settings import BatchingConfig
from processor.batching.stats import BatchStats
from processor.errors import DeadlineExceeded, Internal, Unavailable
from processor.signature import Signature, TensorSpec
from processor.wire_codec import WireCodec

HANDED_BACK = "handed back"  # the native queue did not take the request, or gave its batch back

DT_FLOAT = 1
SIGNATURE = Signature("serving_default", {"x": TensorSpec("x", "x:0", DT_FLOAT, None)},
                      {a: TensorSpec(a, f"{a}:0", DT_FLOAT, None) for a in ("y", "z")})


class _RunnerBackend:
    """The backend face of a FakeGroup that BatchRunner calls (on the queue's threads)."""

    native_engine = None

    def __init__(self, group: FakeGroup) -> None:
        self.lanes = group.lanes
        self.run = group.run_on


class NativeQueues:
    """The native queue with the reference Batcher's test surface: one queue per group (as one
    per version), all on one row budget; a request it does not take is :data:`HANDED_BACK`."""

    native = True

    def __init__(self, settings: BatchingConfig) -> None:
        self.settings = settings
        self.budget = new_budget(settings.queue_rows)
        self._codec = WireCodec(SIGNATURE)
        self._queues: dict[FakeGroup, object] = {}
        self._errors = Batcher("m", settings)  # the refusals' wording (starts no thread)

    def _queue(self, group: FakeGroup):
        if group not in self._queues:
            self._queues[group] = native_queue.open_queue(_RunnerBackend(group), self._codec, self.settings,
                                                          self.budget)
        return self._queues[group]

    def submit(self, group, feeds, aliases, deadline=None):
        data = codec.encode_request(feeds, output_filter=list(aliases))
        ticket = self._queue(group).submit(data, deadline or 0.0)
        if ticket is None:
            return HANDED_BACK
        if isinstance(ticket, str):
            raise self._errors.refusal(ticket)
        return ticket, aliases

    def wait(self, queued):
        ticket, aliases = queued
        out = ticket.wait()
        if out is None:
            return HANDED_BACK
        if isinstance(out, str):
            raise self._errors.refusal(out)
        answer = codec.decode_response(out)
        return [answer[a] for a in aliases]

    def run(self, group, feeds, aliases, deadline=None):
        queued = self.submit(group, feeds, aliases, deadline)
        return queued if queued == HANDED_BACK else self.wait(queued)

    def describe(self) -> dict:
        stats = [q.stats() for q in self._queues.values()]
        total = {k: sum(s[k] for s in stats) for k in ("queued_requests", "queued_rows")}
        snapshot = BatchStats(self.settings.max_batch_size).snapshot()
        for s in stats:
            snapshot = {k: v + s.get(k, 0) if isinstance(v, int) else v for k, v in snapshot.items()}
        return {**snapshot, **total}

    def close(self, timeout=None) -> bool:
        for queue in self._queues.values():
            queue.close()
        return True


class ReferenceBatcher(Batcher):
    native = False


IMPLEMENTATIONS = ["reference", pytest.param("native", marks=pytest.mark.skipif(
    native.MODULE is None, reason="processor._native is not built"))]


@pytest.fixture(params=IMPLEMENTATIONS)
def make(request):
    made = []

    def make_batcher(**settings):
        config = BatchingConfig(**settings)
        batcher = ReferenceBatcher("m", config) if request.param == "reference" else NativeQueues(config)
        made.append(batcher)
        return batcher

    yield make_batcher
    for batcher in made:
        batcher.close(5)


def rows(*values) -> dict[str, np.ndarray]:
    return {"x": np.array(values, np.float32).reshape(-1, 1)}


def test_a_full_batch_runs_at_once_as_one_call_and_splits_back(make):
    group = FakeGroup()
    batcher = make(max_batch_size=8, batch_timeout_micros=10_000_000)
    queued = [batcher.submit(group, rows(i, i + 0.5), ("y",)) for i in range(4)]  # 8 rows: full
    for i, request in enumerate(queued):
        (y,) = batcher.wait(request)
        np.testing.assert_array_equal(y, [[2 * i], [2 * i + 1]])
    assert group.calls == [(8, ("y",))]
    info = batcher.describe()
    assert (info["batches"], info["requests"], info["rows"], info["queued_requests"]) == (1, 4, 8, 0)


def test_the_timeout_flushes_a_partial_batch(make):
    group = FakeGroup()
    batcher = make(max_batch_size=64, batch_timeout_micros=20_000)
    queued = [batcher.submit(group, rows(i), ("y",)) for i in range(3)]
    assert [batcher.wait(r)[0].item() for r in queued] == [0, 2, 4]
    assert group.calls == [(3, ("y",))]


def test_batches_are_padded_to_the_next_allowed_size_and_the_padding_dropped(make):
    group = FakeGroup()
    batcher = make(max_batch_size=8, batch_timeout_micros=10_000, allowed_batch_sizes=[2, 4, 8])
    queued = [batcher.submit(group, rows(i), ("y",)) for i in (1, 2, 3)]
    assert [batcher.wait(r)[0].tolist() for r in queued] == [[[2.0]], [[4.0]], [[6.0]]]
    assert group.calls == [(4, ("y",))]
    assert batcher.describe()["padding_rows"] == 1


def test_each_request_gets_the_outputs_it_asked_for(make):
    group = FakeGroup()
    batcher = make(max_batch_size=2, batch_timeout_micros=20_000)
    a = batcher.submit(group, rows(1), ("z",))
    b = batcher.submit(group, rows(2), ("y", "z"))
    assert [o.tolist() for o in batcher.wait(a)] == [[[2.0]]]
    assert [o.tolist() for o in batcher.wait(b)] == [[[4.0]], [[3.0]]]
    if batcher.native:  # its kind of request includes the outputs: these two run apart
        assert sorted(group.calls) == [(1, ("y", "z")), (1, ("z",))]
    else:
        assert group.calls == [(2, ("z", "y"))]  # the union, in first-asked order


def test_requests_of_different_groups_or_shapes_never_merge(make):
    old, new = FakeGroup(), FakeGroup()
    batcher = make(max_batch_size=4, batch_timeout_micros=20_000)
    queued = [batcher.submit(old, rows(1), ("y",)), batcher.submit(new, rows(2), ("y",)),
              batcher.submit(old, {"x": np.ones((1, 2), np.float32)}, ("y",))]
    for r in queued:
        batcher.wait(r)
    assert sorted(old.calls) == [(1, ("y",)), (1, ("y",))] and new.calls == [(1, ("y",))]


def test_requests_that_cannot_merge_run_alone_at_once(make):
    group = FakeGroup()
    batcher = make(max_batch_size=2, batch_timeout_micros=10_000_000)
    big = batcher.run(group, rows(1, 2, 3), ("y",))  # more rows than a batch holds
    scalar = batcher.run(group, {"x": np.array(5, np.float32)}, ("y",))  # no batch dimension
    if batcher.native:  # not taken: the reference runs them alone
        assert big == scalar == HANDED_BACK and group.calls == []
        return
    assert big[0].ravel().tolist() == [2, 4, 6]
    assert scalar[0].item() == 10
    assert batcher.describe()["run_alone"] == 2 and batcher.describe()["batches"] == 0


def test_a_failing_merged_call_is_retried_alone_so_only_the_culprit_fails(make):
    group = FakeGroup(fail_on=-1)
    batcher = make(max_batch_size=4, batch_timeout_micros=10_000_000)
    queued = [batcher.submit(group, rows(v), ("y",)) for v in (1, -1, 2, 3)]
    results = []
    for r in queued:
        try:
            answer = batcher.wait(r)
            results.append(answer if answer == HANDED_BACK else answer[0].item())
        except Internal as exc:
            results.append(str(exc))
    if batcher.native:  # the runner hands the batch back: the reference retries each alone
        assert results == [HANDED_BACK] * 4 and [c[0] for c in group.calls] == [4]
        return
    assert results == [2, "ValueError: the model refused the value -1", 4, 6]
    assert [c[0] for c in group.calls] == [4, 1, 1, 1, 1]
    assert batcher.describe()["isolated_retries"] == 4


def test_outputs_that_are_not_per_row_make_that_kind_run_alone(make):
    group = FakeGroup(not_per_row=True)
    batcher = make(max_batch_size=2, batch_timeout_micros=10_000_000)
    queued = [batcher.submit(group, rows(v), ("y",)) for v in (1, 2)]
    answers = [batcher.wait(r) for r in queued]
    if batcher.native:  # the runner hands the batch back (the reference then learns the kind)
        assert answers == [HANDED_BACK] * 2 and [c[0] for c in group.calls] == [2]
        return
    assert [a[0].tolist() for a in answers] == [[[1.0]], [[2.0]]]  # each alone: its own sum
    assert batcher.run(group, rows(3), ("y",))[0].tolist() == [[3.0]]  # now not even queued
    assert [c[0] for c in group.calls] == [2, 1, 1, 1]
    assert batcher.describe()["run_alone"] == 1


def test_a_full_queue_refuses_at_once_with_unavailable(make):
    group = FakeGroup()
    batcher = make(max_batch_size=2, max_enqueued_batches=1, batch_timeout_micros=10_000_000,
                   num_batch_threads=1)
    group.hold()
    running = batcher.submit(group, rows(1, 2), ("y",))  # full: taken by the only thread, which blocks
    assert group.entered.wait(10)
    waiting = batcher.submit(group, rows(3, 4), ("y",))  # full, queued: the queue holds 2 rows
    with pytest.raises(Unavailable, match="batching queue is full"):
        batcher.submit(group, rows(5), ("y",))
    group.release.set()
    assert batcher.wait(running)[0].ravel().tolist() == [2, 4]
    assert batcher.wait(waiting)[0].ravel().tolist() == [6, 8]
    assert batcher.describe()["rejected_queue_full"] == 1


def test_expired_requests_are_dropped_before_they_run(make):
    group = FakeGroup()
    batcher = make(max_batch_size=2, batch_timeout_micros=10_000_000, num_batch_threads=1)
    with pytest.raises(DeadlineExceeded):
        batcher.submit(group, rows(1), ("y",), deadline=time.monotonic() - 1)
    group.hold()
    running = batcher.submit(group, rows(1, 2), ("y",))
    assert group.entered.wait(10)
    late = batcher.submit(group, rows(3), ("y",), deadline=time.monotonic() + 0.01)
    on_time = batcher.submit(group, rows(4), ("y",), deadline=time.monotonic() + 60)  # fills the batch
    time.sleep(0.05)  # the first deadline passes while the only thread is busy
    group.release.set()
    batcher.wait(running)
    with pytest.raises(DeadlineExceeded, match="deadline passed"):
        batcher.wait(late)
    assert batcher.wait(on_time)[0].tolist() == [[8.0]]
    assert [c[0] for c in group.calls] == [2, 1]
    assert batcher.describe()["expired"] == 2


def test_close_runs_what_is_queued_then_refuses(make):
    group = FakeGroup()
    batcher = make(max_batch_size=64, batch_timeout_micros=10_000_000)
    queued = [batcher.submit(group, rows(i), ("y",)) for i in range(3)]
    done = []
    waiter = threading.Thread(target=lambda: done.extend(batcher.wait(r)[0].item() for r in queued))
    waiter.start()
    assert batcher.close(10)
    waiter.join(10)
    assert done == [0, 2, 4] and group.calls == [(3, ("y",))]
    with pytest.raises(Unavailable, match="shutting down"):
        batcher.submit(group, rows(1), ("y",))


def test_batch_threads_use_their_own_lanes(make):
    group = FakeGroup()
    batcher = make(max_batch_size=1, batch_timeout_micros=0, num_batch_threads=2)
    for i in range(20):
        batcher.run(group, rows(i), ("y",))
    assert set(group.lanes_used) <= {0, 1}


# --- the model's one row budget -----------------------------------------------------------------

@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_row_budget_takes_what_fits_and_gets_it_back(kind):
    budget = RowBudget(5) if kind == "reference" else native.MODULE.RowBudget(5)
    assert budget.try_take(3) and budget.try_take(2)
    assert not budget.try_take(1) and budget.used == 5
    budget.give(3)
    assert not budget.try_take(4) and budget.try_take(3) and budget.used == 5


def test_the_reference_batcher_starts_its_threads_on_the_first_queued_request():
    batcher = Batcher("m", BatchingConfig(max_batch_size=2, batch_timeout_micros=0))
    try:
        assert not any(t.name.startswith("sp-batch-m-") for t in threading.enumerate())
        assert batcher.run(FakeGroup(), rows(1), ("y",))[0].tolist() == [[2.0]]
    finally:
        assert batcher.close(5)


@pytest.mark.skipif(native.MODULE is None, reason="processor._native is not built")
def test_the_native_queues_and_the_reference_share_the_model_budget():
    """One bound per model: rows waiting in a version's native queue leave that much less for the
    reference and for another version's queue, and come back when their batch starts."""
    settings = BatchingConfig(max_batch_size=2, max_enqueued_batches=2, batch_timeout_micros=10_000_000,
                              num_batch_threads=1)
    queues = NativeQueues(settings)
    reference = Batcher("m", settings, queues.budget)
    old, new = FakeGroup(), FakeGroup()
    try:
        first = queues.submit(old, rows(1), ("y",))  # 1 of 4 rows, waits for a partner
        second = queues.submit(new, rows(2), ("y",))  # another version's queue: 2 of 4
        third = reference.submit(old, rows(3), ("y",))  # the reference: 3 of 4
        assert queues.budget.used == 3
        with pytest.raises(Unavailable, match="queue is full"):
            queues.submit(new, rows(4, 5), ("y",))
        with pytest.raises(Unavailable, match="queue is full"):
            reference.submit(new, rows(4, 5), ("y",))
        fourth = queues.submit(old, rows(4), ("y",))  # fills old's batch: it runs, its rows come back
        assert queues.wait(first)[0].tolist() == [[2.0]] and queues.wait(fourth)[0].tolist() == [[8.0]]
        assert queues.budget.used == 2  # new's request and the reference's still wait
        assert reference.submit(new, rows(6, 7), ("y",)) is not None
    finally:
        queues.close()
        reference.close(5)
    assert queues.wait(second)[0].tolist() == [[4.0]] and reference.wait(third)[0].tolist() == [[6.0]]
    assert queues.budget.used == 0


@pytest.mark.skipif(native.MODULE is None, reason="processor._native is not built")
def test_a_native_ticket_dropped_unawaited_waits_for_its_batch_first():
    """A ticket keeps the request's bytes the queue reads; dropping it before its batch ran
    waits for the answer (without the GIL: the runner needs it) instead of freeing them."""
    group = FakeGroup()
    queues = NativeQueues(BatchingConfig(max_batch_size=4, batch_timeout_micros=20_000))
    try:
        kept = queues.submit(group, rows(1), ("y",))
        dropped = queues.submit(group, rows(2), ("y",))
        del dropped  # returns once the batch ran
        assert group.calls == [(2, ("y",))]
        assert queues.wait(kept)[0].tolist() == [[2.0]]
        assert queues.budget.used == 0
    finally:
        queues.close()
