"""Synthetic Criteo-like batches and the AUC metric."""

from __future__ import annotations

import numpy as np
import pytest

from demo.metrics import roc_auc
from demo.synthetic_data import synthetic_batch, synthetic_labeled_batch


def test_feeds_have_the_signature_dtypes_and_shapes():
    feeds = synthetic_batch(10, seed=1)
    assert set(feeds) == {"dense", "sparse_ids", "sparse_tokens"}
    assert feeds["dense"].dtype == np.float32 and feeds["dense"].shape == (10, 13)
    assert feeds["sparse_ids"].dtype == np.int64 and feeds["sparse_ids"].shape == (10, 20)
    tokens = feeds["sparse_tokens"]
    assert tokens.dtype == object and tokens.shape == (10, 6)
    assert all(isinstance(t, bytes) and len(t) == 8 for t in tokens.ravel())
    assert np.all(feeds["dense"] >= 0)


def test_deterministic_for_a_seed():
    a, b, c = synthetic_batch(50, seed=5), synthetic_batch(50, seed=5), synthetic_batch(50, seed=6)
    for alias in a:
        np.testing.assert_array_equal(a[alias], b[alias])
    assert not np.array_equal(a["sparse_ids"], c["sparse_ids"])


def test_ids_use_the_whole_int64_range_and_repeat():
    ids = synthetic_batch(5_000, seed=0)["sparse_ids"]
    assert ids.min() < 0 < ids.max()
    assert np.abs(ids).max() > 2**62
    assert len(np.unique(ids[:, 0])) < 5_000  # Zipf-like: frequent values recur


def test_labels_carry_a_learnable_signal():
    batch = synthetic_labeled_batch(20_000, seed=[0, 9])
    assert batch.labels.shape == (20_000, 1)
    assert 0.1 < batch.labels.mean() < 0.4
    assert roc_auc(batch.labels, batch.probabilities) > 0.7


def test_roc_auc():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert roc_auc([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9]) == 0.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert roc_auc([0, 1, 1], [0.2, 0.2, 0.9]) == 0.75
    with pytest.raises(ValueError):
        roc_auc([1, 1], [0.1, 0.2])
