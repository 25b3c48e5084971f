"""Exact area under the ROC curve (numpy; no scikit-learn)."""

import numpy as np
import torch

__all__ = ["roc_auc"]


def roc_auc(scores: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U; tied scores count one half).

    Args:
        scores: ``(n,)`` any real scores (probabilities or logits).
        labels: ``(n,)`` 0/1.

    Returns:
        The AUC, or NaN when ``labels`` hold a single class.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel() > 0.5
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    # Average rank (1-based) of each run of tied scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    u = ranks[labels].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))
