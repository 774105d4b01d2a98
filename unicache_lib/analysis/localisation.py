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


def object_word_selectivity(model, processor, samples, patch: int | None = None) -> "pd.DataFrame":
    """Ask ``where is the {colour} {shape} ?`` about every object of every multi-object sample, and
    measure the shape word's attention on that object vs the other objects, per layer.

    Returns one row per (sample, object, layer): ``selectivity`` (mean over heads of the map,
    then :func:`selectivity`) and ``top_on_target`` (is the most-attended patch on the object).
    """
    import pandas as pd

    from ..capture import AttentionCapture
    from ..capture.runner import model_inputs, spans_fn
    from ..world.scenes import patch_grid_masks

    patch = patch or model.config.vision_config.patch_size
    rows = []
    for s in samples:
        if len(s.objects) < 2:
            continue
        po = patch_grid_masks(s.masks, patch)
        for t, o in enumerate(s.objects):
            q = f"where is the {o['colour']} {o['shape']} ?"
            inputs = model_inputs(processor, s.image, q)
            sp = spans_fn(model)(inputs["input_ids"])
            toks = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
            pos = max(i for i, w in enumerate(toks) if w == o["shape"])
            a, b = sp.image_range()
            with torch.no_grad(), AttentionCapture(model, "full", spans=sp) as cap:
                model(**inputs)
            for r in cap.result:
                w = r.probs[:, pos, a:b].mean(0)
                rows.append({"sample": s.id, "object": t, "layer": r.layer,
                             "selectivity": selectivity(w, po, t), "top_on_target": bool(po[int(w.argmax())] == t)})
    return pd.DataFrame(rows)
