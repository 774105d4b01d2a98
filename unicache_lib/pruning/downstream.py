"""What pruning some heads does to the *other* layers' attention (claim P3), with its control.

Pruning any head moves the attention of the layers above it a little; a claim that one kind of head
matters must beat the same count of random heads from the same layers:

    cells = random_heads(eligible, n=4, seed=0)                 # bool [units, heads], 4 random eligible heads
    base = capture_samples(model, processor, samples).records   # unpruned statistics records
    ch = downstream_changes(model, processor, space, samples, keep, skip_layers=[0], base=base)
    ch.groupby("sample").d_entropy.mean()                       # one value per sample: the unit of the interval
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..capture.runner import capture_samples
from ..core.errors import InputError
from .heads import HeadMask, HeadSpace


def random_heads(eligible: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Bool mask of the shape of ``eligible [units, heads]`` with ``n`` of its True cells chosen uniformly at
    random (``numpy.random.default_rng(seed)``, without replacement): the control for a scored selection of
    ``n`` heads among the same eligible ones."""
    eligible = np.asarray(eligible, bool)
    cells = np.argwhere(eligible)
    if not 0 <= n <= len(cells):
        raise InputError(f"cannot draw {n} heads from {len(cells)} eligible ones: pass 0 <= n <= eligible.sum()")
    out = np.zeros(eligible.shape, bool)
    out[tuple(cells[np.random.default_rng(seed).choice(len(cells), n, replace=False)].T)] = True
    return out


def downstream_changes(model, processor, space: HeadSpace, samples, keep, skip_layers=(), base=None) -> pd.DataFrame:
    """Per (sample, layer not in ``skip_layers``): the mean absolute change of the rows' normalised entropy
    (``d_entropy``) and image share (``d_image_share``) when ``keep [units, heads]`` (1 = keep, 0 = masked
    exactly, :class:`~unicache_lib.pruning.HeadMask`) is applied, against the unpruned model.

    ``samples``: a standard sample list (:func:`unicache_lib.world.samples.load`); ``base``: the unpruned
    stats records of those samples, to reuse over several masks (captured here when None)."""
    base = capture_samples(model, processor, samples, progress=False).records if base is None else base
    with HeadMask(space, torch.as_tensor(keep, dtype=torch.float32)):
        pruned = capture_samples(model, processor, samples, progress=False).records
    if len(base) != len(pruned):
        raise InputError(f"{len(base)} unpruned records for {len(pruned)} pruned ones: pass base= of the same samples")
    skip = set(skip_layers)
    rows = []
    for a, b in zip(base, pruned):
        if (a.sample, a.layer) != (b.sample, b.layer):
            raise InputError("base= records are not in the capture's order: pass the records of the same samples")
        if a.layer in skip:
            continue
        rows.append({"sample": a.sample, "layer": a.layer,
                     "d_entropy": float((a.data["norm_entropy"] - b.data["norm_entropy"]).abs().nanmean()),
                     "d_image_share": float((a.data["image_share"] - b.data["image_share"]).abs().nanmean())})
    return pd.DataFrame(rows, columns=["sample", "layer", "d_entropy", "d_image_share"])
