"""ContextRunner over a fake engine part (processor/context/runner.py): which path a request
takes, what the main part is fed, the cache and the weights it follows."""

from __future__ import annotations

import numpy as np
import pytest

from processor.context.cache import ContextCache
from processor.context.rows import RowPlan
from processor.context.runner import ContextRunner
from processor.errors import InvalidArgument
from processor.signature import Signature, TensorSpec

SIG = Signature("serving_default", {
    "user": TensorSpec("user", "user:0", 1, (-1, 2)),
    "item": TensorSpec("item", "item:0", 1, (-1, 3)),
}, {"y": TensorSpec("y", "y:0", 1, (-1, 1)), "user_vec": TensorSpec("user_vec", "uv:0", 1, (-1, 2))})


def model(feeds):
    """The whole model: y = sum(2 * user) + sum(item) per row; user_vec = 2 * user."""
    uv = 2 * feeds["user"]
    return {"y": uv.sum(1, keepdims=True) + feeds["item"].sum(1, keepdims=True), "user_vec": uv}


class FakePart:
    context_inputs = frozenset({"user"})
    boundary = ("uv:0",)
    context_outputs = {"user_vec": 0}
    direct_inputs = frozenset()

    def __init__(self):
        self.context_runs, self.main_feeds = 0, []

    def run_context(self, lane, feeds):
        self.context_runs += 1
        assert set(feeds) == {"user"} and len(feeds["user"]) == 1
        return [2 * feeds["user"]]

    def run_main(self, lane, feeds, boundary, fetches):
        self.main_feeds.append(feeds)
        assert fetches == ("y",) and boundary[0].shape[0] == len(feeds["item"])
        return [boundary[0].sum(1, keepdims=True) + feeds["item"].sum(1, keepdims=True)]

    def describe(self):
        return {}

    def close(self):
        pass


def backend_run(lane, feeds, fetches):
    rows = {len(v) for v in feeds.values()}
    assert len(rows) == 1, "the backend only ever sees inputs that agree on their rows"
    out = model(feeds)
    return [out[a] for a in fetches]


def make(cache=None, declared=frozenset({"user"})):
    part = FakePart()
    # an engine part exists only for a declared context (processor/engine/open_group.py)
    return ContextRunner(RowPlan(SIG, declared), backend_run, part if declared else None, cache), part


def feeds(users=1, items=4, seed=0):
    rng = np.random.default_rng(seed)
    return {"user": rng.standard_normal((users, 2)).astype(np.float32),
            "item": rng.standard_normal((items, 3)).astype(np.float32)}


def tiled(f):
    return {**f, "user": np.repeat(f["user"], len(f["item"]), axis=0)}


def test_paths_and_answers():
    runner, part = make()
    f = feeds()
    want = model(tiled(f))
    y, uv = runner.run(0, f, ("y", "user_vec"))
    np.testing.assert_allclose(y, want["y"], rtol=1e-6)
    np.testing.assert_allclose(uv, want["user_vec"], rtol=1e-6)  # a context output, repeated
    assert part.context_runs == 1 and set(part.main_feeds[0]) == {"item"}
    assert runner.run(0, tiled(f), ("y",))[0].shape == (4, 1)  # rows agree: the backend
    stats = runner.stats()
    assert (stats["context_once"], stats["tiled"], stats["broadcast_requests"]) == (1, 0, 1)


def test_undeclared_context_is_tiled():
    runner, part = make(declared=None)
    f = feeds()
    np.testing.assert_allclose(runner.run(0, f, ("y",))[0], model(tiled(f))["y"], rtol=1e-6)
    assert runner.stats()["tiled"] == 1 and part.context_runs == 0


def test_refusals_are_counted():
    runner, _ = make()
    f = {**feeds(users=4), "item": feeds()["item"][:1]}
    with pytest.raises(InvalidArgument):
        runner.run(0, f, ("y",))
    assert runner.stats()["refused"] == 1


def test_the_cache_follows_the_weights():
    stamp = [0]
    runner, part = make(ContextCache(4))
    runner.weights_stamp = lambda: stamp[0]
    f = feeds()
    for _ in range(3):
        runner.run(0, {**f, "item": feeds(items=3, seed=9)["item"]}, ("y",))
    assert part.context_runs == 1 and runner.stats()["cache"]["hits"] == 2
    stamp[0] = 7  # another worker wrote a delta into the shared weights
    runner.run(0, f, ("y",))
    assert part.context_runs == 2 and runner.stats()["cache"]["invalidations"] == 1
    runner.invalidate()  # this process's own delta
    runner.run(0, f, ("y",))
    assert part.context_runs == 3


def test_warm_runs_the_part_uncounted_and_uncached():
    runner, part = make(ContextCache(4))
    runner.warm(0, feeds(), ("y",))
    assert part.context_runs == 1
    stats = runner.stats()
    assert stats["context_once"] == 0 and stats["cache"]["entries"] == 0
