"""Which requests are broadcast ones, the refusal of an undeclared one-row input, tiling; the
context cache (processor/context/rows.py, cache.py)."""

from __future__ import annotations

import numpy as np
import pytest

from processor.context.cache import ContextCache
from processor.context.rows import RowPlan, tile
from processor.errors import ConfigError, InvalidArgument
from processor.signature import Signature, TensorSpec

SIG = Signature("serving_default", {
    "user": TensorSpec("user", "user:0", 9, (-1, 3)),
    "dense": TensorSpec("dense", "dense:0", 1, (-1, 2)),
    "item": TensorSpec("item", "item:0", 9, (-1,)),
    "fixed": TensorSpec("fixed", "fixed:0", 1, (4, 2)),
    "scalar": TensorSpec("scalar", "scalar:0", 1, ()),
}, {"y": TensorSpec("y", "y:0", 1, (-1, 1))})


def feeds(user=5, dense=5, item=5):
    return {"user": np.arange(user * 3).reshape(user, 3), "dense": np.ones((dense, 2), np.float32),
            "item": np.arange(item), "fixed": np.zeros((4, 2), np.float32), "scalar": np.float32(1)}


def test_rows_that_agree_are_no_broadcast():
    plan = RowPlan(SIG)
    assert plan.per_row == ("user", "dense", "item")
    assert plan.broadcast(feeds()) is None
    assert plan.broadcast(feeds(1, 1, 1)) is None  # one row everywhere: an ordinary batch-1 request


def test_one_row_inputs_among_n_rows_are_broadcast():
    plan = RowPlan(SIG)
    assert plan.broadcast(feeds(user=1)) == (5, frozenset({"user"}))
    assert plan.broadcast(feeds(user=1, dense=1)) == (5, frozenset({"user", "dense"}))
    assert plan.broadcast(feeds(user=2, dense=1)) is None  # three row counts: the engine's to judge


def test_declared_context_refuses_a_stray_one_row_input():
    plan = RowPlan.for_config(SIG, ["user", "dense:0"])
    assert plan.declared == {"user", "dense"}
    assert plan.broadcast(feeds(user=1)) == (5, frozenset({"user"}))
    with pytest.raises(InvalidArgument) as err:
        plan.broadcast(feeds(item=1))
    message = str(err.value)
    assert "'item' has 1 row where the request's other inputs have 5" in message
    assert "context_inputs ['dense', 'user']" in message


def test_declared_context_is_checked_against_the_signature():
    with pytest.raises(ConfigError, match="'nope' is not an input"):
        RowPlan.for_config(SIG, ["nope"])
    with pytest.raises(ConfigError, match="input 'fixed' has shape \\[4, 2\\]; a context input must be taken per row"):
        RowPlan.for_config(SIG, ["fixed"])
    with pytest.raises(ConfigError, match="'scalar' has shape \\[\\]"):
        RowPlan.for_config(SIG, ["scalar"])


def test_tile_is_the_tiled_request():
    f = feeds(user=1)
    tiled = tile(f, {"user"}, 5)
    assert tiled["user"].shape == (5, 3) and (tiled["user"] == f["user"][0]).all()
    assert tiled["user"].flags.c_contiguous and tiled["item"] is f["item"]


def test_a_one_row_input_into_a_fixed_batch_is_a_clear_400():
    from processor import codec

    with pytest.raises(InvalidArgument) as err:
        codec.decode_arrays({**feeds(), "fixed": np.zeros((1, 2), np.float32)}, None, SIG)
    assert "shape [1, 2] given, signature expects [4, 2]" in str(err.value)
    assert "only an input whose first dimension the signature leaves free may be sent as one row" in str(err.value)


# --- the cache ---------------------------------------------------------------------------------

def _value(x: float):
    return (np.full((1, 4), x, np.float32),)


def test_cache_keys_by_content_and_evicts_the_least_recent():
    cache = ContextCache(2)
    k = [cache.key({"u": np.array([[i]])}, ("u",)) for i in range(3)]
    assert cache.key({"u": np.array([[0]])}, ("u",)) == k[0]
    assert cache.key({"u": np.array([[0]], np.int32)}, ("u",)) != k[0]  # dtype is part of the key
    assert cache.get(k[0]) is None
    for i in range(2):
        assert cache.put(k[i], _value(i), cache.generation)
    assert cache.get(k[0])[0][0, 0] == 0  # k[0] is now the most recent
    cache.put(k[2], _value(2), cache.generation)
    assert cache.get(k[1]) is None and cache.get(k[0]) is not None
    stats = cache.stats()
    assert (stats["entries"], stats["hits"], stats["misses"], stats["evictions"]) == (2, 2, 2, 1)
    assert stats["bytes"] == 2 * (16 + 8)


def test_cache_keys_strings_by_value():
    a = np.array([[b"x", b"y"]], dtype=object)
    b = np.array([[b"x", b"y"]], dtype=object)
    assert ContextCache.key({"s": a}, ("s",)) == ContextCache.key({"s": b}, ("s",))


def test_cache_expires_by_age():
    now = [0.0]
    cache = ContextCache(4, ttl_ms=100, clock=lambda: now[0])
    key = cache.key({"u": np.array([[1]])}, ("u",))
    cache.put(key, _value(1), cache.generation)
    now[0] = 0.1
    assert cache.get(key) is not None
    now[0] = 0.2001
    assert cache.get(key) is None
    assert cache.stats()["expired"] == 1 and cache.stats()["entries"] == 0


def test_a_clear_refuses_results_computed_before_it():
    cache = ContextCache(4)
    key = cache.key({"u": np.array([[1]])}, ("u",))
    generation = cache.generation  # a request starts computing its context
    cache.clear()  # a delta lands
    assert not cache.put(key, _value(1), generation)
    assert cache.get(key) is None
    assert cache.put(key, _value(2), cache.generation)
    assert cache.stats()["invalidations"] == 1
