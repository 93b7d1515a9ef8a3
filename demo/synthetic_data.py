"""Synthetic Criteo-like data with a planted click signal.

Each example has 13 dense counts, 20 raw int64 ids and 6 string tokens (see
:mod:`demo.ctr_spec`). Categorical values follow a Zipf-like law (rank ``r`` of a vocabulary
of ``V`` has probability about ``1 / ((r + 1) ln V)``), so a few values are frequent and the
tail is long, as in real click logs. Ids are 64-bit hashes of (feature, rank), spread over the
whole int64 range (negative ones included); tokens are 8 lowercase hex digits like Criteo's.

The click probability is ``sigmoid(bias + dense effect + sum of per-value effects)``: fixed
weights on the latent dense signal, and a pseudo-random effect in ``[-1, 1]`` times a per-feature
strength for each categorical value. The world (vocabularies, effects) is the same for every
seed; the seed only chooses which examples are drawn. Same seed, same arrays.

This module does not import TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from demo.ctr_spec import (
    DENSE_INPUT,
    FULL_TABLE_SHAPES,
    IDS_INPUT,
    NUM_DENSE,
    NUM_ID_FEATURES,
    TOKENS_INPUT,
)

_VOCAB = np.array([rows for rows, _ in FULL_TABLE_SHAPES], dtype=np.float64)
_BIAS = -1.4
# Weights of the latent dense signal (some features carry none).
_DENSE_WEIGHTS = np.array([0.5, -0.4, 0.3, 0.0, 0.25, 0.0, -0.3, 0.2, 0.0, 0.15, 0.0, -0.2, 0.1])
# Location and spread of log1p(count) per dense feature.
_DENSE_LOC = np.linspace(0.5, 3.0, NUM_DENSE)
_DENSE_SCALE = np.linspace(1.2, 0.6, NUM_DENSE)
# Strength of each categorical feature's per-value effect (C1..C26; zeros are pure noise).
_CATEGORICAL_STRENGTH = np.array(
    [0.8, 0.6, 0.5, 0.0, 0.4, 0.3, 0.0, 0.5, 0.3, 0.0, 0.4, 0.2, 0.0,
     0.3, 0.2, 0.0, 0.3, 0.0, 0.2, 0.0, 0.7, 0.5, 0.0, 0.3, 0.2, 0.0]
)  # fmt: skip
_EFFECT_SALT = np.uint64(0x5EED_C7A1_0000_0001)
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(28, -1, -4, dtype=np.uint64)


@dataclass(frozen=True)
class LabeledBatch:
    """A batch with its labels.

    Attributes:
        feeds: ``dense`` float32 ``[n, 13]``, ``sparse_ids`` int64 ``[n, 20]``, ``sparse_tokens``
            object ``[n, 6]`` of ``bytes``.
        labels: float32 ``[n, 1]`` of 0/1 clicks.
        probabilities: float64 ``[n]``, the true click probability of each example (the best
            any model can do; its AUC is the ceiling).
    """

    feeds: dict[str, np.ndarray]
    labels: np.ndarray
    probabilities: np.ndarray


def synthetic_batch(batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """Feeds for ``batch_size`` examples, keyed by the CTR model's input aliases.

    Returns:
        ``{"dense": float32 [n, 13], "sparse_ids": int64 [n, 20],
        "sparse_tokens": object [n, 6] of bytes}``; deterministic for ``seed``.
    """
    return synthetic_labeled_batch(batch_size, seed).feeds


def synthetic_labeled_batch(batch_size: int, seed: int | Sequence[int]) -> LabeledBatch:
    """``batch_size`` labelled examples, deterministic for ``seed`` (anything
    ``numpy.random.default_rng`` accepts, e.g. ``[seed, stream, step]``).

    Raises:
        ValueError: ``batch_size`` is not positive.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    rng = np.random.default_rng(seed)

    latent = rng.standard_normal((batch_size, NUM_DENSE))
    log_counts = np.maximum(_DENSE_LOC + _DENSE_SCALE * latent, 0.0)
    dense = np.floor(np.expm1(log_counts)).astype(np.float32)

    # Zipf-like ranks: log-uniform over [1, V], shifted to [0, V).
    ranks = np.floor(np.exp(rng.random((batch_size, len(_VOCAB))) * np.log(_VOCAB))).astype(np.uint64) - 1
    keys = _splitmix64(np.arange(len(_VOCAB), dtype=np.uint64) << np.uint64(40) | ranks)
    sparse_ids = keys[:, :NUM_ID_FEATURES].view(np.int64)
    sparse_tokens = _hex_tokens(keys[:, NUM_ID_FEATURES:])

    effects = _unit_interval(_splitmix64(keys ^ _EFFECT_SALT)) * 2.0 - 1.0
    logits = _BIAS + latent @ _DENSE_WEIGHTS + effects @ _CATEGORICAL_STRENGTH
    probabilities = 1.0 / (1.0 + np.exp(-logits))
    labels = (rng.random(batch_size) < probabilities).astype(np.float32).reshape(-1, 1)

    feeds = {DENSE_INPUT: dense, IDS_INPUT: sparse_ids, TOKENS_INPUT: sparse_tokens}
    return LabeledBatch(feeds=feeds, labels=labels, probabilities=probabilities)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, elementwise on uint64 (wrap-around arithmetic)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _unit_interval(h: np.ndarray) -> np.ndarray:
    """Map uint64 hashes to floats in [0, 1)."""
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _hex_tokens(h: np.ndarray) -> np.ndarray:
    """The low 32 bits of each hash as 8 lowercase hex digits, an object array of bytes."""
    nibbles = (h[..., None] >> _NIBBLE_SHIFTS) & np.uint64(0xF)
    chars = np.ascontiguousarray(_HEX_DIGITS[nibbles])
    return chars.view("S8")[..., 0].astype(object)
