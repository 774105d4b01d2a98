"""Weak localisation (claim U11): does a word that names an object attend to that object's patches
more than to the *other* objects of the image?

Measured against the other objects, not against the object's area: background patches are all
alike, so even a random model's top patch lands on *some* object often.
"""
from __future__ import annotations

import numpy as np
import torch


def selectivity(weights, patch_object: np.ndarray, target: int) -> float:
    """Mean attention per patch on object ``target`` divided by the mean per patch on the other
    objects.

    Args:
        weights: ``[n_patches]`` one token's attention over the image patches.
        patch_object: ``[n_patches]`` object index per patch, -1 for background
            (:func:`~unicache_lib.world.scenes.patch_grid_masks`).
    Returns:
        > 1 when the named object is preferred; NaN when the image has no other object or the
        target covers no patch.
    """
    w = torch.as_tensor(weights).float().numpy()
    po = np.asarray(patch_object)
    if w.shape != po.shape:
        raise ValueError(f"{w.shape[0]} weights for {po.shape[0]} patches")
    on = po == target
    other = (po >= 0) & ~on
    if not on.any() or not other.any():
        return float("nan")
    denom = w[other].mean()
    return float(w[on].mean() / denom) if denom > 0 else float("inf")
