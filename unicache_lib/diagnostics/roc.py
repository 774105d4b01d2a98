"""AUROC without a fitting library: the Mann-Whitney statistic, ties counted half."""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def auroc(scores, labels) -> float:
    """Probability that a positive (``labels`` true) scores higher than a negative; NaN when one
    class is empty. ``scores`` higher = more likely positive."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape:
        raise ValueError(f"{s.shape} scores for {y.shape} labels")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rank_average(*scores) -> np.ndarray:
    """Combine scores without fitting: the mean of their ranks scaled to [0, 1]."""
    out = [rankdata(np.asarray(s, dtype=float)) / len(s) for s in scores]
    return np.mean(out, 0)
