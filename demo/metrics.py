"""Evaluation metrics (numpy only)."""

from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (ties count half).

    Computed from the Mann-Whitney rank statistic. Both arrays are flattened.

    Raises:
        ValueError: different lengths, or only one class present.
    """
    positive = np.asarray(labels).ravel() > 0.5
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if positive.shape != scores.shape:
        raise ValueError(f"{positive.size} labels but {scores.size} scores")
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = np.argsort(scores, kind="mergesort")
    _, tie_group, tie_counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(tie_counts)
    mean_rank = ends - (tie_counts - 1) / 2.0  # 1-based average rank of each tie group
    ranks = np.empty(scores.size)
    ranks[order] = mean_rank[tie_group]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
