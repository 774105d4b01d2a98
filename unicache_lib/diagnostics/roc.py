"""AUROC without a fitting library: the Mann-Whitney statistic, ties counted half."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from ..core.errors import InputError
from ..intervals import grouped


def auroc(scores, labels) -> float:
    """Probability that a positive (``labels`` true) scores higher than a negative; NaN when one
    class is empty. ``scores`` higher = more likely positive."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape:
        raise InputError(f"{s.shape} scores for {y.shape} labels")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rank_average(*scores) -> np.ndarray:
    """Combine scores without fitting: the mean of their ranks scaled to [0, 1]."""
    return np.mean([rankdata(np.asarray(s, dtype=float)) / len(s) for s in scores], 0)


def auroc_interval(scores, labels, unit: str = "questions", n_boot: int = 2000, seed: int = 0, versus=None):
    """AUROC of ``scores [n]`` for ``labels [n]`` (true = positive, e.g. a wrong answer) with a 95% *stratified*
    bootstrap interval: positives and negatives are resampled separately, so every resample keeps the observed
    number of each (with ~20 positives a plain resample would let that count drift and widen the interval for
    no reason). ``versus`` (another ``[n]`` score): the interval of ``AUROC(scores) - AUROC(versus)`` on the same
    resamples (paired). Returns an :class:`~unicache_lib.intervals.Interval` whose ``n`` is the number of items
    and whose unit names the stratification; raises when either class has fewer than 2 items."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    v = None if versus is None else np.asarray(versus, dtype=float)
    if s.shape != y.shape or (v is not None and v.shape != y.shape):
        raise InputError(f"{s.shape} scores, {y.shape} labels{'' if v is None else f', {v.shape} versus'}: one value per item")
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    if min(len(pos), len(neg)) < 2:
        raise InputError(f"{len(pos)} positives and {len(neg)} negatives: an AUROC interval needs at least 2 of each "
                         "(measure more items, e.g. raise N_QUESTIONS)")

    def stat(g):
        idx = np.concatenate([g["pos"], g["neg"]])
        a = auroc(s[idx], y[idx])
        return a if v is None else a - auroc(v[idx], y[idx])

    iv = grouped({"pos": list(pos), "neg": list(neg)}, unit, stat, n_boot=n_boot, seed=seed)
    return dataclasses.replace(iv, n=len(y), unit=f"{unit} ({len(pos)} positive, {len(neg)} negative, resampled apart)")


def read_auroc(iv) -> dict:
    """A reading of an AUROC interval with its direction named. ``iv``: an interval of the AUROC of a score
    oriented so that high = positive. Returns ``strength`` = max(AUROC, 1 - AUROC) (how well the score separates
    in whichever direction it does), ``direction`` (``"as oriented"`` above 0.5, ``"inverted"`` below: the
    positives score *lower*), and ``separates``: ``"yes"`` when the interval excludes 0.5, ``"no evidence"`` when
    it straddles 0.5."""
    return {"strength": max(iv.value, 1 - iv.value),
            "direction": "as oriented" if iv.value > 0.5 else "inverted" if iv.value < 0.5 else "none",
            "separates": "yes" if (iv.lo > 0.5 or iv.hi < 0.5) else "no evidence (interval straddles 0.5)"}


def auroc_table(scores: dict, labels, unit: str = "questions", n_boot: int = 2000, seed: int = 0):
    """One row per named score (``{name: [n] scores, high = positive}``): AUROC with its stratified 95% interval
    (:func:`auroc_interval`) and its reading (:func:`read_auroc`): columns ``auroc, lo, hi, strength,
    direction, separates``."""
    ivs = {name: auroc_interval(sc, labels, unit, n_boot, seed) for name, sc in scores.items()}
    rows = {name: {"auroc": iv.value, "lo": iv.lo, "hi": iv.hi, **read_auroc(iv)} for name, iv in ivs.items()}
    return pd.DataFrame(rows).T.astype({"auroc": float, "lo": float, "hi": float, "strength": float})
