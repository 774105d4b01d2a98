"""Notebook 01's method claims (M1-M4) as data, and their measurements on a
:class:`~unicache_lib.scoreboard.Scoreboard`, so the notebook's claims cell reads as a few calls.

:func:`declare` writes the lesson's rules, made from :mod:`unicache_lib.claims` (each claim, its statement and
rule written once there), on a board. One ``measure_*`` function per claim captures what it needs and records its interval:

- :func:`measure_fp16_bias`: M1, the signed mean fp16 - fp32 difference of row statistics, per sample;
- :func:`measure_repeatability`: M2, the largest difference between two captures of the same samples;
- :func:`measure_batch_anchors`: M3, how many of a sample's anchors survive batch averaging;
- :func:`measure_between_sets`: M4, headline statistics on a second, disjoint standard set.

Every interval resamples samples (2,000 bootstrap resamples, fixed seed).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..claims import BIAS, STATISTICS, rules_of
from ..capture.runner import capture_samples
from ..intervals import Interval, bootstrap, difference_interval, extreme_of, mean_interval
from .understanding import layer_table
from .anchors import batching_overlap, image_reads
from ..world import samples as sample_set
from ..stats import row_statistics_in_dtype
from ..progress import bar

HEADLINE = ["norm_entropy", "max_weight", "cross_modal", "top10_share"]  # M4's per-sample statistics



def declare(board, anchor_k: int) -> None:
    """Write M1-M4's rules on ``board`` before any measurement (``anchor_k``: M3's top-k)."""
    board.declare(rules_of("01_capture", k=anchor_k))


def measure_fp16_bias(board, model, processor, samples, memory_check=None) -> dict:
    """M1: per sample, full maps captured one sample at a time (``memory_check()`` first, if given), each row statistic
    computed in fp16 and in fp32 arithmetic; the per-sample signed mean difference per statistic, its interval over
    samples recorded per criterion. Returns statistic -> :class:`~unicache_lib.intervals.Interval`."""
    if memory_check is not None:
        memory_check()
    bias = {k: [] for k in STATISTICS}
    for s in bar(samples, desc="M1: fp16 vs fp32 statistics"):
        per = [(row_statistics_in_dtype(r.probs, torch.float16), row_statistics_in_dtype(r.probs, torch.float32))
               for r in capture_samples(model, processor, [s], mode="full", progress=False)]  # one sample's maps
        for k in bias:
            bias[k].append(float(np.mean([(lo[k] - hi[k]).mean().item() for lo, hi in per])))
    m1 = {k: mean_interval(v, "samples") for k, v in bias.items()}
    for k, iv in m1.items():
        board.measure("M1", iv, criterion=k)
    return m1


def measure_repeatability(board, model, processor, samples, res):
    """M2: capture ``samples`` again in ``stats`` mode; per sample the largest |difference| of any statistic from the
    first capture ``res``; the interval of the maximum over samples."""
    res2 = capture_samples(model, processor, samples, mode="stats")
    per_sample = {}
    for a, b in zip(res, res2):
        per_sample[a.sample] = max(per_sample.get(a.sample, 0.0),
                                   max((a.data[k] - b.data[k]).abs().nan_to_num().max().item() for k in a.data))
    m2 = bootstrap(list(per_sample.values()), max, "samples")
    board.measure("M2", m2, shown=f"max |Δ| = {m2.value:.1e}")
    return m2


def measure_batch_anchors(board, res, image_part: str, anchor_k: int):
    """M3: in the deepest layer that reads the image, each sample's top-``anchor_k`` anchors against the anchors of the
    batch-averaged reads (Jaccard per sample, mean interval over samples)."""
    deep = max(r.layer for r in res if r.part == image_part)
    m3 = mean_interval(batching_overlap([image_reads(res[s, deep]) for s in res.samples], anchor_k)["per_sample"],
                       "samples")
    board.measure("M3", m3, shown=f"mean Jaccard {m3.value:.2f} (layer {deep})")
    return m3


def largest_gap(per_a: pd.DataFrame, per_b: pd.DataFrame, unit: str = "samples per set") -> Interval:
    """The largest |between-set difference| over the columns (statistics) of two independent sets, with an
    interval built from each statistic's own unpaired interval (intersection-union: "every difference is below
    t" holds when every statistic's interval is inside ±t): ``lo`` = the farthest any interval stays from 0,
    ``hi`` = the farthest any interval reaches. A bootstrap of the maximum itself is biased (each resample's
    noise raises the maximum) and no bootstrap interval is reliable for it."""
    ivs = [difference_interval(per_a[c].to_numpy(), per_b[c].to_numpy(), unit, paired=False) for c in per_a.columns]
    return extreme_of([Interval(abs(i.value), max(0.0, i.lo, -i.hi), max(abs(i.lo), abs(i.hi)), i.n, unit)
                       for i in ivs], max)  # |difference| per statistic, then the largest


def measure_between_sets(board, model, processor, res, image_part: str, per_type: int, sample_seed: int):
    """M4: the standard set of ``sample_seed + 1`` (disjoint, same recipe) captured in ``stats`` mode; the headline
    statistics per sample (mean over layers) of both sets; the largest between-set difference with its interval
    (bootstrap over both sets' samples). Returns the interval and a table per statistic: set A, set B, A - B, its
    95% interval (low, high) and, with ``per_type >= 2``, the split-half difference within set A (plain sampling noise)."""
    other = sample_set.load(per_type=per_type, seed=sample_seed + 1)
    res_b = capture_samples(model, processor, other, mode="stats")
    per_a = layer_table([r for r in res if r.part == image_part]).groupby("sample")[HEADLINE].mean()
    per_b = layer_table([r for r in res_b if r.part == image_part]).groupby("sample")[HEADLINE].mean()
    m4 = largest_gap(per_a, per_b)
    gaps = pd.DataFrame({"set A": per_a.mean(), "set B": per_b.mean(), "A - B": per_a.mean() - per_b.mean()})
    ivs = [difference_interval(per_a[c].to_numpy(), per_b[c].to_numpy(), "samples per set", paired=False)
           for c in gaps.index]
    gaps["A - B low"], gaps["A - B high"] = [i.lo for i in ivs], [i.hi for i in ivs]  # each statistic's 95% interval
    half = per_a.index.str.rsplit("-", n=1).str[1].astype(int) < per_type / 2  # first half of every scene type
    if per_type >= 2:
        gaps["half 1 - half 2 of A"] = per_a[half].mean() - per_a[~half].mean()
    board.measure("M4", m4, shown=f"largest between-set difference {m4.value:.3f} ({gaps['A - B'].abs().idxmax()}); "
                  f"{len(other)} samples of SAMPLE_SEED {sample_seed + 1}")
    return m4, gaps
